package controller

import (
	"errors"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/epd-dev/coordinator/dataplane/base/config"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// deployment returns a Deployment of want replicas at generation 2 whose status is set by mutate.
func deployment(want int32, mutate func(*appsv1.DeploymentStatus)) *appsv1.Deployment {
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "cp", Generation: 2},
		Spec:       appsv1.DeploymentSpec{Replicas: ptr.To(want)},
		Status: appsv1.DeploymentStatus{
			ObservedGeneration: 2, Replicas: want, UpdatedReplicas: want, ReadyReplicas: want, AvailableReplicas: want,
		},
	}
	if mutate != nil {
		mutate(&d.Status)
	}
	return d
}

func TestRolloutOf(t *testing.T) {
	tests := map[string]struct {
		dep          *appsv1.Deployment
		wantExists   bool
		wantComplete bool
		wantStalled  bool
		wantMessage  string
	}{
		"no deployment": {dep: nil, wantMessage: "no valid configuration"},
		"complete":      {dep: deployment(2, nil), wantExists: true, wantComplete: true, wantMessage: "2 of 2 replicas updated and available"},
		"scaled to zero": {
			dep: deployment(0, nil), wantExists: true, wantComplete: true,
		},
		"generation not observed": {
			dep:        deployment(2, func(s *appsv1.DeploymentStatus) { s.ObservedGeneration = 1 }),
			wantExists: true, wantMessage: "observe generation 2",
		},
		"not all updated": {
			dep:        deployment(3, func(s *appsv1.DeploymentStatus) { s.UpdatedReplicas = 1 }),
			wantExists: true, wantMessage: "1 of 3 replicas updated",
		},
		"old replicas still running": {
			dep:        deployment(2, func(s *appsv1.DeploymentStatus) { s.Replicas = 3 }),
			wantExists: true, wantMessage: "1 old replicas pending termination",
		},
		"updated but not available": {
			dep:        deployment(2, func(s *appsv1.DeploymentStatus) { s.AvailableReplicas = 1 }),
			wantExists: true, wantMessage: "1 of 2 updated replicas available",
		},
		"progress deadline exceeded": {
			dep: deployment(2, func(s *appsv1.DeploymentStatus) {
				s.UpdatedReplicas = 1
				s.Conditions = []appsv1.DeploymentCondition{{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionFalse,
					Reason: "ProgressDeadlineExceeded", Message: `ReplicaSet "cp-1" has timed out progressing.`}}
			}),
			wantExists: true, wantStalled: true, wantMessage: "has timed out progressing",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			r := rolloutOf(tc.dep)
			g.Expect(r.exists).To(Equal(tc.wantExists))
			g.Expect(r.complete).To(Equal(tc.wantComplete))
			g.Expect(r.stalled).To(Equal(tc.wantStalled))
			g.Expect(r.message).To(ContainSubstring(tc.wantMessage))
		})
	}
}

type wantCondition struct {
	status metav1.ConditionStatus
	reason coordinatorv1alpha1.ConditionReason
}

func TestComputeStatus(t *testing.T) {
	validCfg, err := renderConfig(newPipeline("ns", "cp"), testGateway)
	if err != nil {
		t.Fatal(err)
	}
	valid := found[error](nil)
	invalid := error(&config.FieldError{Key: "pipeline.steps[1].params.bogus", Reason: "unknown parameter"})
	okPool := found(resolution{ok: true, reason: coordinatorv1alpha1.ReasonResolved, message: "found"})
	okGateway := found(resolution{ok: true, reason: coordinatorv1alpha1.ReasonAddressSet, address: testGateway, message: "set"})
	T, F := metav1.ConditionTrue, metav1.ConditionFalse

	U := metav1.ConditionUnknown
	withRoute := func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Route = &coordinatorv1alpha1.RouteSpec{ParentRef: &coordinatorv1alpha1.RouteParentReference{Name: "gw"}}
	}
	routeReady := observed{pool: okPool, gateway: okGateway, pipeline: valid, applied: found(&validCfg),
		deployment: found(deployment(2, nil)), route: found[*acceptance](nil)}

	tests := map[string]struct {
		// mutate changes the pipeline (spec, or status before the computation).
		mutate func(*coordinatorv1alpha1.CoordinatorPipeline)
		obs    observed
		want   map[coordinatorv1alpha1.ConditionType]wantCondition
		// absent lists conditions that must not be there.
		absent []coordinatorv1alpha1.ConditionType
		// check looks at the rest of the status.
		check func(g Gomega, st coordinatorv1alpha1.CoordinatorPipelineStatus)
	}{
		"ready": {
			obs: observed{pool: okPool, gateway: okGateway, pipeline: valid, applied: found(&validCfg),
				deployment: found(deployment(2, nil))},
			want: map[coordinatorv1alpha1.ConditionType]wantCondition{
				coordinatorv1alpha1.ConditionReady:                 {T, coordinatorv1alpha1.ReasonReady},
				coordinatorv1alpha1.ConditionProgressing:           {F, coordinatorv1alpha1.ReasonRolloutComplete},
				coordinatorv1alpha1.ConditionDegraded:              {F, coordinatorv1alpha1.ReasonAsExpected},
				coordinatorv1alpha1.ConditionPipelineValid:         {T, coordinatorv1alpha1.ReasonValid},
				coordinatorv1alpha1.ConditionInferencePoolResolved: {T, coordinatorv1alpha1.ReasonResolved},
				coordinatorv1alpha1.ConditionGatewayResolved:       {T, coordinatorv1alpha1.ReasonAddressSet},
			},
			check: func(g Gomega, st coordinatorv1alpha1.CoordinatorPipelineStatus) {
				g.Expect(st.ConfigRevision).To(Equal(validCfg.Revision()))
				g.Expect(st.PipelineSteps).To(Equal("conditional-decode,prefill,decode"))
				g.Expect(st.GatewayAddress).To(Equal(testGateway))
				g.Expect(st.Replicas).To(BeEquivalentTo(2))
				g.Expect(st.ReadyReplicas).To(BeEquivalentTo(2))
				g.Expect(st.Selector).To(Equal("app.kubernetes.io/instance=cp,app.kubernetes.io/name=coordinator"))
			},
		},
		"rolling out": {
			obs: observed{pool: okPool, gateway: okGateway, pipeline: valid, applied: found(&validCfg),
				deployment: found(deployment(2, func(s *appsv1.DeploymentStatus) { s.UpdatedReplicas = 1 }))},
			want: map[coordinatorv1alpha1.ConditionType]wantCondition{
				coordinatorv1alpha1.ConditionReady:       {F, coordinatorv1alpha1.ReasonDeploymentNotReady},
				coordinatorv1alpha1.ConditionProgressing: {T, coordinatorv1alpha1.ReasonRollingOut},
				coordinatorv1alpha1.ConditionDegraded:    {F, coordinatorv1alpha1.ReasonAsExpected},
			},
		},
		"rollout stalled": {
			obs: observed{pool: okPool, gateway: okGateway, pipeline: valid, applied: found(&validCfg),
				deployment: found(deployment(2, func(s *appsv1.DeploymentStatus) {
					s.Conditions = []appsv1.DeploymentCondition{{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionFalse, Reason: "ProgressDeadlineExceeded"}}
				}))},
			want: map[coordinatorv1alpha1.ConditionType]wantCondition{
				coordinatorv1alpha1.ConditionReady:       {F, coordinatorv1alpha1.ReasonDeploymentNotReady},
				coordinatorv1alpha1.ConditionProgressing: {F, coordinatorv1alpha1.ReasonProgressDeadlineExceeded},
				coordinatorv1alpha1.ConditionDegraded:    {T, coordinatorv1alpha1.ReasonProgressDeadlineExceeded},
			},
		},
		"invalid pipeline keeps serving the last good config": {
			obs: observed{pool: okPool, gateway: okGateway, pipeline: found(invalid), applied: found(&validCfg),
				deployment: found(deployment(1, nil))},
			want: map[coordinatorv1alpha1.ConditionType]wantCondition{
				coordinatorv1alpha1.ConditionReady:         {F, coordinatorv1alpha1.ReasonInvalidPipeline},
				coordinatorv1alpha1.ConditionPipelineValid: {F, coordinatorv1alpha1.ReasonInvalidPipeline},
				coordinatorv1alpha1.ConditionDegraded:      {T, coordinatorv1alpha1.ReasonInvalidPipeline},
				coordinatorv1alpha1.ConditionProgressing:   {F, coordinatorv1alpha1.ReasonRolloutComplete},
			},
			check: func(g Gomega, st coordinatorv1alpha1.CoordinatorPipelineStatus) {
				pv := meta.FindStatusCondition(st.Conditions, string(coordinatorv1alpha1.ConditionPipelineValid))
				g.Expect(pv.Message).To(Equal("pipeline.steps[1].params.bogus: unknown parameter"))
				g.Expect(st.ConfigRevision).To(Equal(validCfg.Revision()))
				g.Expect(meta.FindStatusCondition(st.Conditions, string(coordinatorv1alpha1.ConditionDegraded)).Message).
					To(ContainSubstring("keep serving configuration revision " + validCfg.Revision()))
			},
		},
		"invalid from the start": {
			obs: observed{pool: okPool, gateway: okGateway, pipeline: found(invalid), deployment: found[*appsv1.Deployment](nil)},
			want: map[coordinatorv1alpha1.ConditionType]wantCondition{
				coordinatorv1alpha1.ConditionReady:       {F, coordinatorv1alpha1.ReasonInvalidPipeline},
				coordinatorv1alpha1.ConditionProgressing: {F, coordinatorv1alpha1.ReasonNoValidConfig},
				coordinatorv1alpha1.ConditionDegraded:    {T, coordinatorv1alpha1.ReasonInvalidPipeline},
			},
			check: func(g Gomega, st coordinatorv1alpha1.CoordinatorPipelineStatus) {
				g.Expect(st.ConfigRevision).To(BeEmpty())
				g.Expect(st.Replicas).To(BeZero())
			},
		},
		"pool missing": {
			obs: observed{pool: found(resolution{reason: coordinatorv1alpha1.ReasonNotFound, message: "InferencePool pool not found"}),
				gateway: okGateway, pipeline: valid, applied: found(&validCfg), deployment: found(deployment(1, nil))},
			want: map[coordinatorv1alpha1.ConditionType]wantCondition{
				coordinatorv1alpha1.ConditionReady:                 {F, coordinatorv1alpha1.ReasonInferencePoolNotResolved},
				coordinatorv1alpha1.ConditionInferencePoolResolved: {F, coordinatorv1alpha1.ReasonNotFound},
				coordinatorv1alpha1.ConditionDegraded:              {F, coordinatorv1alpha1.ReasonAsExpected},
			},
		},
		"gateway address pending": {
			obs: observed{pool: okPool, gateway: found(resolution{reason: coordinatorv1alpha1.ReasonAddressPending, message: "no address"}),
				pipeline: valid, deployment: found[*appsv1.Deployment](nil)},
			want: map[coordinatorv1alpha1.ConditionType]wantCondition{
				coordinatorv1alpha1.ConditionReady:           {F, coordinatorv1alpha1.ReasonGatewayNotResolved},
				coordinatorv1alpha1.ConditionGatewayResolved: {F, coordinatorv1alpha1.ReasonAddressPending},
				coordinatorv1alpha1.ConditionPipelineValid:   {T, coordinatorv1alpha1.ReasonValid},
			},
		},
		"api error before any phase": {
			obs: observed{err: errors.New("etcd is on fire")},
			want: map[coordinatorv1alpha1.ConditionType]wantCondition{
				coordinatorv1alpha1.ConditionReady:    {F, coordinatorv1alpha1.ReasonReconcileError},
				coordinatorv1alpha1.ConditionDegraded: {T, coordinatorv1alpha1.ReasonReconcileError},
			},
			check: func(g Gomega, st coordinatorv1alpha1.CoordinatorPipelineStatus) {
				g.Expect(st.Conditions).To(HaveLen(2), "conditions of phases that did not run are not invented")
			},
		},
		"route pending: no gateway controller reported yet": {
			mutate: withRoute,
			obs: with(routeReady, func(o *observed) {
				o.route = found(&acceptance{U, coordinatorv1alpha1.ReasonPending, "HTTPRoute cp: no gateway controller has reported on Gateway gw yet"})
			}),
			want: map[coordinatorv1alpha1.ConditionType]wantCondition{
				coordinatorv1alpha1.ConditionRouteAccepted: {U, coordinatorv1alpha1.ReasonPending},
				coordinatorv1alpha1.ConditionReady:         {F, coordinatorv1alpha1.ReasonRouteNotAccepted},
				coordinatorv1alpha1.ConditionDegraded:      {F, coordinatorv1alpha1.ReasonAsExpected},
			},
			check: func(g Gomega, st coordinatorv1alpha1.CoordinatorPipelineStatus) {
				g.Expect(meta.FindStatusCondition(st.Conditions, string(coordinatorv1alpha1.ConditionReady)).Message).
					To(ContainSubstring("no gateway controller has reported"))
			},
		},
		"route accepted": {
			mutate: withRoute,
			obs:    with(routeReady, func(o *observed) { o.route = found(&acceptance{T, coordinatorv1alpha1.ReasonAccepted, "accepted"}) }),
			want: map[coordinatorv1alpha1.ConditionType]wantCondition{
				coordinatorv1alpha1.ConditionRouteAccepted: {T, coordinatorv1alpha1.ReasonAccepted},
				coordinatorv1alpha1.ConditionReady:         {T, coordinatorv1alpha1.ReasonReady},
			},
		},
		"route rejected by the gateway": {
			mutate: withRoute,
			obs: with(routeReady, func(o *observed) {
				o.route = found(&acceptance{F, coordinatorv1alpha1.ReasonNotAccepted, "NotAllowedByListeners"})
			}),
			want: map[coordinatorv1alpha1.ConditionType]wantCondition{
				coordinatorv1alpha1.ConditionRouteAccepted: {F, coordinatorv1alpha1.ReasonNotAccepted},
				coordinatorv1alpha1.ConditionReady:         {F, coordinatorv1alpha1.ReasonRouteNotAccepted},
			},
		},
		"route requested, route phase did not run": {
			mutate: withRoute,
			obs:    with(routeReady, func(o *observed) { o.route = result[*acceptance]{} }),
			want: map[coordinatorv1alpha1.ConditionType]wantCondition{
				coordinatorv1alpha1.ConditionReady: {F, coordinatorv1alpha1.ReasonRouteNotAccepted},
			},
			absent: []coordinatorv1alpha1.ConditionType{coordinatorv1alpha1.ConditionRouteAccepted},
		},
		"route removed from the spec: its condition goes": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Status.Conditions = []metav1.Condition{{Type: string(coordinatorv1alpha1.ConditionRouteAccepted), Status: T, Reason: "Accepted"}}
			},
			obs: routeReady,
			want: map[coordinatorv1alpha1.ConditionType]wantCondition{
				coordinatorv1alpha1.ConditionReady: {T, coordinatorv1alpha1.ReasonReady},
			},
			absent: []coordinatorv1alpha1.ConditionType{coordinatorv1alpha1.ConditionRouteAccepted},
		},
		"child conflict": {
			obs: observed{pool: okPool, gateway: okGateway, pipeline: valid, err: &conflictError{kind: "Service", name: "cp"}},
			want: map[coordinatorv1alpha1.ConditionType]wantCondition{
				coordinatorv1alpha1.ConditionReady:    {F, coordinatorv1alpha1.ReasonChildConflict},
				coordinatorv1alpha1.ConditionDegraded: {T, coordinatorv1alpha1.ReasonChildConflict},
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			cp := newPipeline("ns", "cp", func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Generation = 7 })
			if tc.mutate != nil {
				tc.mutate(cp)
			}
			computeStatus(cp, tc.obs)
			g.Expect(cp.Status.ObservedGeneration).To(BeEquivalentTo(7))
			for _, c := range cp.Status.Conditions {
				g.Expect(c.ObservedGeneration).To(BeEquivalentTo(7), "condition %s", c.Type)
				g.Expect(c.Reason).NotTo(BeEmpty(), "condition %s", c.Type)
			}
			for typ, want := range tc.want {
				c := meta.FindStatusCondition(cp.Status.Conditions, string(typ))
				g.Expect(c).NotTo(BeNil(), "condition %s", typ)
				g.Expect(c.Status).To(Equal(want.status), "condition %s: %s", typ, c.Message)
				g.Expect(c.Reason).To(Equal(string(want.reason)), "condition %s: %s", typ, c.Message)
			}
			for _, typ := range tc.absent {
				g.Expect(meta.FindStatusCondition(cp.Status.Conditions, string(typ))).To(BeNil(), "condition %s", typ)
			}
			if tc.check != nil {
				tc.check(g, cp.Status)
			}
		})
	}
}

// with returns a copy of o changed by mutate.
func with(o observed, mutate func(*observed)) observed {
	mutate(&o)
	return o
}

// Recomputing an unchanged status must not touch it (no lastTransitionTime bumps): this is what
// keeps a steady object from being written.
func TestComputeStatusIsStable(t *testing.T) {
	g := NewWithT(t)
	cfg, err := renderConfig(newPipeline("ns", "cp"), testGateway)
	g.Expect(err).NotTo(HaveOccurred())
	obs := observed{
		pool:     found(resolution{ok: true, reason: coordinatorv1alpha1.ReasonResolved, message: "found"}),
		gateway:  found(resolution{ok: true, reason: coordinatorv1alpha1.ReasonAddressSet, message: "set"}),
		pipeline: found[error](nil), applied: found(&cfg), deployment: found(deployment(1, nil)),
	}
	cp := newPipeline("ns", "cp")
	computeStatus(cp, obs)
	for i := range cp.Status.Conditions {
		cp.Status.Conditions[i].LastTransitionTime = metav1.NewTime(time.Unix(1000, 0))
	}
	first := cp.Status.DeepCopy()
	computeStatus(cp, obs)
	g.Expect(cp.Status).To(Equal(*first))

	// A real transition moves only the changed condition's time.
	obs.deployment = found(deployment(1, func(s *appsv1.DeploymentStatus) { s.AvailableReplicas = 0 }))
	computeStatus(cp, obs)
	ready := meta.FindStatusCondition(cp.Status.Conditions, string(coordinatorv1alpha1.ConditionReady))
	g.Expect(ready.LastTransitionTime.Unix()).NotTo(BeEquivalentTo(1000))
	valid := meta.FindStatusCondition(cp.Status.Conditions, string(coordinatorv1alpha1.ConditionPipelineValid))
	g.Expect(valid.LastTransitionTime.Unix()).To(BeEquivalentTo(1000))
}
