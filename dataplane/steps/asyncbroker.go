package steps

import (
	// The async-broker step lives in its own package; importing it here registers it wherever
	// the built-in steps are registered: the coordinator and the operator's pipeline validation.
	// It links no Redis client: its runtime, dataplane/broker/redisbroker, is imported by the
	// coordinator only.
	_ "github.com/epd-dev/coordinator/dataplane/steps/asyncbroker"
)
