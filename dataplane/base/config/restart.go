package config

// Setting is one configuration setting: its key as in the YAML document (and in error messages)
// and its value.
type Setting struct {
	Key   string
	Value any
}

// RestartSettings are the settings a running coordinator cannot apply from a reloaded file: the
// listeners (address, timeouts, admin interface and port, TLS) and the tracing setup. It is the
// one list of them: the data plane's reload reports a change of one as restart-required, and the
// operator fingerprints them on the pod template so that a change rolls the Deployment. Renewed
// certificates in server.cert_path and server.metrics_cert_dir are picked up without a restart.
// Everything else (the pipeline, the gateway, the body limit, the drain timeout, Server-Timing,
// the trust in routing headers, the log level) is applied by a reload.
func (c Config) RestartSettings() []Setting {
	suites := c.Server.TLSCipherSuites
	if len(suites) == 0 {
		suites = nil // absent and [] are the same setting
	}
	return []Setting{
		{Key: "server.listen_addr", Value: c.Server.ListenAddr},
		{Key: "server.read_timeout", Value: c.Server.ReadTimeout},
		{Key: "server.write_timeout", Value: c.Server.WriteTimeout},
		{Key: "server.metrics_port", Value: c.Server.MetricsPort},
		{Key: "tracing", Value: c.Tracing},
		{Key: "server.metrics_host", Value: c.Server.MetricsHost},
		{Key: "server.secure_serving", Value: c.Server.SecureServing},
		{Key: "server.cert_path", Value: c.Server.CertPath},
		{Key: "server.tls_min_version", Value: c.Server.TLSMinVersion},
		{Key: "server.tls_cipher_suites", Value: suites},
		{Key: "server.metrics_cert_dir", Value: c.Server.MetricsCertDir},
	}
}
