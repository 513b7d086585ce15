package asyncbroker

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/pipeline/registry"
	"github.com/epd-dev/coordinator/dataplane/state/request"
)

// RuntimePackage is the package that provides the broker runtime; a binary that serves the step
// imports it (cmd/coordinator does).
const RuntimePackage = "github.com/epd-dev/coordinator/dataplane/broker/redisbroker"

// Broker is the Redis side of the step, one per built step: the step validates a request and
// hands it over. The quota classes are ClassReserved and ClassOverflow.
type Broker interface {
	// Classify takes one of the tenant's reserved quota slots, held until ctx ends, and returns
	// ClassReserved, or ClassOverflow when they are all taken.
	Classify(ctx context.Context, log logr.Logger, tenant string) string
	// Queue stores the request (mode ModeEnqueue or ModeWait) in the tenant's route queue with
	// the given time budget and answers it (202, or the result once it arrives).
	Queue(ctx context.Context, rc *request.Context, tenant, mode string, timeout time.Duration) error
	// ServeResult answers GET /v1/requests/{id} for a valid id and tenant.
	ServeResult(w http.ResponseWriter, r *http.Request, tenant, id string)
	// ServeDelete answers DELETE /v1/requests/{id} for a valid id and tenant.
	ServeDelete(w http.ResponseWriter, r *http.Request, tenant, id string)
	// Close releases the broker's connections once the requests still using them are done.
	Close()
}

// Runtime builds the broker of a step from its validated settings. It must not do network I/O.
type Runtime func(s *Settings, deps registry.Deps) (Broker, error)

var runtimeMu sync.RWMutex

// runtime is the registered Runtime (nil: not linked).
var runtime Runtime

// Use registers the broker runtime; package asyncbroker (RuntimePackage) calls it in init. A
// binary that builds the step without it (the operator, which only validates pipelines) links
// no Redis client, and its steps answer queued requests with a 500 naming the missing import.
func Use(r Runtime) {
	runtimeMu.Lock()
	defer runtimeMu.Unlock()
	if runtime != nil {
		panic("asyncbroker: broker runtime registered twice")
	}
	runtime = r
}

func registered() Runtime {
	runtimeMu.RLock()
	defer runtimeMu.RUnlock()
	return runtime
}

// errNotLinked is the cause of the 500 a step without a runtime answers.
var errNotLinked = errors.New("the async-broker step was built without its Redis runtime: import " + RuntimePackage + " in the binary's main package")

// notLinked is the answer of a step without a runtime.
func notLinked() *apierror.Error {
	return &apierror.Error{Status: http.StatusInternalServerError, Type: apierror.TypeAPI, Code: "BROKER_NOT_LINKED",
		Message: "the async broker is not available in this build of the coordinator", Cause: errNotLinked}
}
