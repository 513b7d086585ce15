package steps

import (
	// The async-broker step lives in its own package (it brings a Redis client); importing it
	// here registers it wherever the built-in steps are registered: the coordinator and the
	// operator's pipeline validation.
	_ "github.com/epd-dev/coordinator/dataplane/steps/asyncbroker"
)
