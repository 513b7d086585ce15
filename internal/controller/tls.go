package controller

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/epd-dev/coordinator/dataplane/base/config"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// TLS of the coordinators (spec.server.tls, spec.gateway.caBundle): the Secret and the CA
// ConfigMap are mounted read-only at fixed paths outside ConfigDir (the coordinator watches
// ConfigDir for configuration changes, and the ConfigMap volume there is kubelet's to manage),
// and the rendered configuration points the data plane at them. The data plane reloads a renewed
// certificate from the mounted files, so neither the Secret's nor the ConfigMap's content is
// fingerprinted into the pod template: a rotation does not roll the Deployment.
const (
	// TLSDir is where the serving Secret is mounted: tls.crt and tls.key, the layout of
	// server.cert_path and server.metrics_cert_dir.
	TLSDir = "/etc/coordinator-tls"
	// GatewayCADir is where the gateway CA ConfigMap is mounted; GatewayCAFile
	// (gateway.ca_file) is its key, whatever its name in the ConfigMap.
	GatewayCADir  = "/etc/coordinator-gateway-ca"
	GatewayCAFile = GatewayCADir + "/" + caFileName

	caFileName = "ca.crt"
	tmpDir     = "/tmp"
)

// servingPortName names the API port: https when cfg, the applied configuration, serves TLS
// (nil: none applied yet), http otherwise.
func servingPortName(cfg *config.Config) string {
	if secureServing(cfg) {
		return tlsPortName
	}
	return portName
}

// secureServing reports whether cfg serves the API over TLS.
func secureServing(cfg *config.Config) bool {
	return cfg != nil && cfg.Server.SecureServing
}

// renderTLS sets the configuration keys of spec.server.tls and spec.gateway.caBundle.
func renderTLS(cp *coordinatorv1alpha1.CoordinatorPipeline, cfg *config.Config) {
	if t := cp.Spec.Server.TLS; t != nil {
		cfg.Server.SecureServing = true
		cfg.Server.CertPath = TLSDir
		cfg.Server.MetricsCertDir = TLSDir
		if t.MinVersion != "" {
			cfg.Server.TLSMinVersion = string(t.MinVersion)
		}
		if len(t.CipherSuites) > 0 {
			cfg.Server.TLSCipherSuites = make([]string, len(t.CipherSuites))
			for i, c := range t.CipherSuites {
				cfg.Server.TLSCipherSuites[i] = string(c)
			}
		}
	}
	if cp.Spec.Gateway.CABundle != nil {
		cfg.Gateway.CAFile = GatewayCAFile
	}
}

// addTLSVolumes mounts what cfg, the applied configuration, reads from TLSDir and GatewayCAFile:
// the Secret of spec.server.tls (tls.crt and tls.key only, readable by the coordinator's group)
// and the key of spec.gateway.caBundle's ConfigMap as ca.crt. The paths follow the applied
// configuration, and the names the spec: they disagree only while the spec's pipeline is invalid
// and a TLS setting changed with it, and the coordinators keep the last good configuration until
// the spec is fixed.
func addTLSVolumes(cp *coordinatorv1alpha1.CoordinatorPipeline, cfg config.Config, volumes []corev1.Volume, mounts []corev1.VolumeMount) ([]corev1.Volume, []corev1.VolumeMount) {
	if t := cp.Spec.Server.TLS; t != nil && cfg.Server.CertPath == TLSDir {
		volumes = append(volumes, corev1.Volume{Name: tlsVolume, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: t.SecretName,
			Items: []corev1.KeyToPath{
				{Key: corev1.TLSCertKey, Path: corev1.TLSCertKey},
				{Key: corev1.TLSPrivateKeyKey, Path: corev1.TLSPrivateKeyKey},
			},
			DefaultMode: ptr.To(secretFileMode),
			Optional:    ptr.To(false),
		}}})
		mounts = append(mounts, corev1.VolumeMount{Name: tlsVolume, MountPath: TLSDir, ReadOnly: true})
	}
	if ca := cp.Spec.Gateway.CABundle; ca != nil && cfg.Gateway.CAFile == GatewayCAFile {
		volumes = append(volumes, corev1.Volume{Name: gatewayCAVolume, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: ca.ConfigMapName},
			Items:                []corev1.KeyToPath{{Key: caBundleKey(ca), Path: caFileName}},
			Optional:             ptr.To(false),
		}}})
		mounts = append(mounts, corev1.VolumeMount{Name: gatewayCAVolume, MountPath: GatewayCADir, ReadOnly: true})
	}
	return volumes, mounts
}

// caBundleKey is the ConfigMap key of ca (the CRD defaults it to ca.crt).
func caBundleKey(ca *coordinatorv1alpha1.CABundleReference) string {
	if ca.Key == "" {
		return caFileName
	}
	return ca.Key
}
