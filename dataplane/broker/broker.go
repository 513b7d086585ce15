// Package broker is the async broker as the async-broker step sees it (a bridge between the
// coordinator and an asynchronous request broker, llm-d-async, over Redis): its settings, parsed
// and validated from the step's params (Settings), the Redis URL they name, and the Broker the
// step hands valid requests to. It links no Redis client, so the operator validates pipelines
// through it: the Broker is built by a Runtime the coordinator hands its pipelines
// (package redisbroker). docs/async-broker.md documents the params and the Redis contract.
package broker

import (
	"context"
	"net/http"
	"time"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/state/request"
)

// StepType is the async-broker step's type name.
const StepType = "async-broker"

// Request modes (the mode header's values, case-insensitive).
const (
	ModePassthrough = "passthrough"
	ModeEnqueue     = "enqueue"
	ModeWait        = "wait"
)

// Quota classes of passthrough requests.
const (
	ClassReserved = "reserved"
	ClassOverflow = "overflow"
)

// RequestsPath is the prefix of a queued request's URL, /v1/requests/{id}.
const RequestsPath = "/v1/requests/"

// RuntimePackage is the package whose Runtime serves the step (cmd/coordinator hands it to the
// pipelines it builds).
const RuntimePackage = "github.com/epd-dev/coordinator/dataplane/broker/redisbroker"

// Broker is the Redis side of a step, one per built step: the step validates a request and
// hands it over. The quota classes are ClassReserved and ClassOverflow.
type Broker interface {
	// Classify takes one of the tenant's reserved quota slots, held until ctx ends, and returns
	// ClassReserved, or ClassOverflow when they are all taken.
	Classify(ctx context.Context, log logr.Logger, tenant string) string
	// Queue stores the request (mode ModeEnqueue or ModeWait) in the tenant's route queue with
	// the given time budget and answers it (202, or the result once it arrives): nil once the
	// answer is written.
	Queue(ctx context.Context, rc *request.Context, tenant, mode string, timeout time.Duration) error
	// ServeResult answers GET /v1/requests/{id} for a valid id and tenant.
	ServeResult(w http.ResponseWriter, r *http.Request, tenant, id string)
	// ServeDelete answers DELETE /v1/requests/{id} for a valid id and tenant.
	ServeDelete(w http.ResponseWriter, r *http.Request, tenant, id string)
	// Close releases the broker's connections once the requests still using them are done.
	Close()
}

// Runtime builds the broker of a step from its validated settings, logging on log and reading
// the environment with getenv. It must not do network I/O.
type Runtime func(s *Settings, log logr.Logger, getenv func(string) string) (Broker, error)
