package config

// Setting is one configuration setting: its key as in the YAML document (and in error messages)
// and its value.
type Setting struct {
	Key   string
	Value any
}

// RestartSettings are the settings a running coordinator cannot apply from a reloaded file: the
// listener's address and timeouts, the metrics port and the tracing setup. It is the one list of
// them: the data plane's reload reports a change of one as restart-required, and the operator
// fingerprints them on the pod template so that a change rolls the Deployment. Everything else
// (the pipeline, the gateway, the body limit, the drain timeout, Server-Timing, the log level) is
// applied by a reload.
func (c Config) RestartSettings() []Setting {
	return []Setting{
		{Key: "server.listen_addr", Value: c.Server.ListenAddr},
		{Key: "server.read_timeout", Value: c.Server.ReadTimeout},
		{Key: "server.write_timeout", Value: c.Server.WriteTimeout},
		{Key: "server.metrics_port", Value: c.Server.MetricsPort},
		{Key: "tracing", Value: c.Tracing},
	}
}
