package controller

import (
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

func TestEnsureChildInSync(t *testing.T) {
	// inSync ignores what the API server defaults but notices edits of what we set.
	cp := newPipeline("ns", "cp")
	desired := deploymentFor(t, cp, "")
	defaulted := desired.DeepCopy()
	defaulted.Spec.RevisionHistoryLimit = ptr.To[int32](10)
	defaulted.Spec.ProgressDeadlineSeconds = ptr.To[int32](600)
	defaulted.Spec.Template.Spec.Containers[0].TerminationMessagePath = "/dev/termination-log"
	defaulted.Spec.Template.Spec.Containers[0].ImagePullPolicy = corev1.PullAlways
	defaulted.Spec.Template.Spec.DNSPolicy = corev1.DNSClusterFirst
	defaulted.Spec.Template.Spec.Containers[0].LivenessProbe.SuccessThreshold = 1

	edited := defaulted.DeepCopy()
	edited.Spec.Template.Spec.Containers[0].Args = []string{"--config", "/elsewhere"}
	scaled := defaulted.DeepCopy()
	scaled.Spec.Replicas = ptr.To[int32](0)

	tests := map[string]struct {
		live *appsv1.Deployment
		want bool
	}{
		"identical":             {live: desired, want: true},
		"server defaults added": {live: defaulted, want: true},
		"container args edited": {live: edited, want: false},
		"scaled by hand":        {live: scaled, want: false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			NewWithT(t).Expect(inSync(desired, tc.live)).To(Equal(tc.want))
		})
	}
}

func TestInSyncOtherKinds(t *testing.T) {
	cp := newPipeline("ns", "cp")
	svc := desiredService(cp, nil)
	allocated := svc.DeepCopy()
	allocated.Spec.ClusterIP, allocated.Spec.ClusterIPs = "10.96.0.10", []string{"10.96.0.10"}
	allocated.Spec.SessionAffinity = corev1.ServiceAffinityNone
	allocated.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol}
	retargeted := allocated.DeepCopy()
	retargeted.Spec.Ports[0].Port = 80
	cm := desiredConfigMap(cp, "log_level: 2\n", "r1")
	edited := cm.DeepCopy()
	edited.Data[ConfigKey] = "log_level: 5\n"
	sa := desiredServiceAccount(cp)
	mounting := sa.DeepCopy()
	mounting.AutomountServiceAccountToken = nil

	tests := map[string]struct {
		inSync func() bool
		want   bool
	}{
		"service with allocated IPs":       {inSync: func() bool { return inSync(svc, allocated) }, want: true},
		"service port edited":              {inSync: func() bool { return inSync(svc, retargeted) }, want: false},
		"configmap unchanged":              {inSync: func() bool { return inSync(cm, cm.DeepCopy()) }, want: true},
		"configmap edited by hand":         {inSync: func() bool { return inSync(cm, edited) }, want: false},
		"service account token re-enabled": {inSync: func() bool { return inSync(sa, mounting) }, want: false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) { NewWithT(t).Expect(tc.inSync()).To(Equal(tc.want)) })
	}
}

func TestIsSubset(t *testing.T) {
	tests := map[string]struct {
		sub, super map[string]string
		want       bool
	}{
		"nil in anything":   {sub: nil, super: map[string]string{"x": "y"}, want: true},
		"contained":         {sub: map[string]string{"a": "1"}, super: map[string]string{"x": "y", "a": "1"}, want: true},
		"other value":       {sub: map[string]string{"a": "1"}, super: map[string]string{"a": "0"}, want: false},
		"missing key":       {sub: map[string]string{"a": "1"}, super: map[string]string{"x": "y"}, want: false},
		"in an empty super": {sub: map[string]string{"a": "1"}, super: nil, want: false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) { NewWithT(t).Expect(isSubset(tc.sub, tc.super)).To(Equal(tc.want)) })
	}
}
