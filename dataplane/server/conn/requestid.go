package conn

import (
	"regexp"

	"github.com/google/uuid"
)

// validRequestID is the shape of a client x-request-id that is kept as is.
var validRequestID = regexp.MustCompile(`^[A-Za-z0-9-]{1,128}$`)

// Request ids are not secrets: draw their randomness in batches rather than per request.
func init() { uuid.EnableRandPool() }

// RequestID keeps a valid client id and otherwise generates a UUIDv4; replaced reports that a
// client value was discarded.
func RequestID(client string) (id string, replaced bool) {
	if validRequestID.MatchString(client) {
		return client, false
	}
	return uuid.NewString(), client != ""
}
