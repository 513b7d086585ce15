package controller

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/reload"
	"github.com/epd-dev/coordinator/dataplane/server"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

func serving(pod, revision string) podRevision {
	return podRevision{pod: pod, status: PodPipelineStatus{Revision: revision, Reload: &PodReloadStatus{}}}
}

func rejecting(pod, serves, rejected, err string) podRevision {
	return podRevision{pod: pod, status: PodPipelineStatus{Revision: serves, Reload: &PodReloadStatus{LastError: err, RejectedRevision: rejected}}}
}

func TestRevisionRolloutOf(t *testing.T) {
	long := strings.Repeat("x", 2000)
	var many []podRevision
	for i := range 5 {
		many = append(many, rejecting(fmt.Sprintf("pod-%d", i), "r1", "r2", long))
	}
	tests := map[string]struct {
		replicas int32
		// depReady is the Deployment's readyReplicas (default: replicas).
		depReady    *int32
		survey      *podSurvey
		status      metav1.ConditionStatus
		reason      coordinatorv1alpha1.ConditionReason
		updated     int32
		requeue     time.Duration
		contains    []string
		notContains []string
	}{
		"no Deployment": {replicas: 2, status: metav1.ConditionFalse, reason: coordinatorv1alpha1.ReasonNoValidConfig},
		"all on the current revision": {
			replicas: 2, survey: &podSurvey{pods: []podRevision{serving("a", "r2"), serving("b", "r2")}},
			status: metav1.ConditionTrue, reason: coordinatorv1alpha1.ReasonRolledOut, updated: 2,
			contains: []string{"2 of 2 desired replicas serve revision r2 (2 ready)"},
		},
		"without a reload watcher": {
			replicas: 1, survey: &podSurvey{pods: []podRevision{{pod: "a", status: PodPipelineStatus{Revision: "r2"}}}},
			status: metav1.ConditionTrue, reason: coordinatorv1alpha1.ReasonRolledOut, updated: 1,
		},
		"the Deployment does not count them ready yet": {
			replicas: 2, depReady: ptr.To[int32](0), survey: &podSurvey{pods: []podRevision{serving("a", "r2"), serving("b", "r2")}},
			status: metav1.ConditionFalse, reason: coordinatorv1alpha1.ReasonProgressing, updated: 2,
			contains: []string{"2 of 2 desired replicas serve revision r2 (2 ready; the Deployment counts 0)"},
		},
		"a revision a pod reports is cut": {
			replicas: 1, survey: &podSurvey{pods: []podRevision{serving("a", long)}},
			status: metav1.ConditionFalse, reason: coordinatorv1alpha1.ReasonProgressing, requeue: rolloutPollInterval,
			notContains: []string{strings.Repeat("x", maxRevisionLen+1)},
		},
		"scaled to zero": {
			replicas: 0, survey: &podSurvey{},
			status: metav1.ConditionTrue, reason: coordinatorv1alpha1.ReasonRolledOut,
		},
		"one pod on the old revision": {
			replicas: 2, survey: &podSurvey{pods: []podRevision{serving("a", "r2"), serving("b", "r1")}},
			status: metav1.ConditionFalse, reason: coordinatorv1alpha1.ReasonProgressing, updated: 1, requeue: rolloutPollInterval,
			contains: []string{"1 of 2 desired replicas", "not yet: b serves r1"},
		},
		"an older rejection does not count": {
			replicas: 1, survey: &podSurvey{pods: []podRevision{rejecting("a", "r0", "r1", "bad")}},
			status: metav1.ConditionFalse, reason: coordinatorv1alpha1.ReasonProgressing, requeue: rolloutPollInterval,
		},
		"current revision waiting for a restart": {
			replicas: 1, survey: &podSurvey{pods: []podRevision{{pod: "a", status: PodPipelineStatus{Revision: "r2",
				Reload: &PodReloadStatus{RestartRequired: []string{"server.secure_serving"}}}}}},
			status: metav1.ConditionFalse, reason: coordinatorv1alpha1.ReasonProgressing, requeue: rolloutPollInterval,
			contains: []string{"a (waits for a restart for server.secure_serving)"},
		},
		"fewer ready pods than desired": {
			replicas: 3, survey: &podSurvey{pods: []podRevision{serving("a", "r2")}},
			status: metav1.ConditionFalse, reason: coordinatorv1alpha1.ReasonProgressing, updated: 1,
			contains: []string{"1 of 3 desired replicas serve revision r2 (1 ready)"},
		},
		"surge pod on the old revision": {
			replicas: 2, survey: &podSurvey{pods: []podRevision{serving("a", "r2"), serving("b", "r2"), serving("c", "r1")}},
			status: metav1.ConditionFalse, reason: coordinatorv1alpha1.ReasonProgressing, updated: 2, requeue: rolloutPollInterval,
		},
		"a pod rejected the current revision": {
			replicas: 2, survey: &podSurvey{pods: []podRevision{serving("a", "r2"), rejecting("b", "r1", "r2", "pipeline.steps[0]: boom")}},
			status: metav1.ConditionFalse, reason: coordinatorv1alpha1.ReasonConfigRejected, updated: 1, requeue: rejectedPollInterval,
			contains: []string{"revision r2 rejected by 1 of 2 ready pods", "b serves r1: pipeline.steps[0]: boom"},
		},
		"an older coordinator rejected a newer key": {
			replicas: 1, survey: &podSurvey{pods: []podRevision{func() podRevision {
				p := rejecting("a", "r1", "r2", "canary: unknown key (known keys: gateway, log_level, pipeline, server, tracing)")
				p.status.ConfigSchema = 1
				return p
			}()}},
			status: metav1.ConditionFalse, reason: coordinatorv1alpha1.ReasonConfigRejected, requeue: rejectedPollInterval,
			contains: []string{"a serves r1: canary: unknown key", "(its coordinator reads configuration schema 1)"},
		},
		"rejections are bounded": {
			replicas: 5, survey: &podSurvey{pods: many},
			status: metav1.ConditionFalse, reason: coordinatorv1alpha1.ReasonConfigRejected, requeue: rejectedPollInterval,
			contains: []string{"pod-0", "pod-2", "and 2 more", "..."}, notContains: []string{"pod-3", long},
		},
		"a pod that cannot be asked": {
			replicas: 2, survey: &podSurvey{pods: []podRevision{serving("a", "r2"), {pod: "b", err: "connection refused"}}},
			status: metav1.ConditionUnknown, reason: coordinatorv1alpha1.ReasonRevisionUnknown, updated: 1, requeue: unknownPollInterval,
			contains: []string{"1 of 2 ready pods could not be asked", "b: connection refused"},
		},
		// A coordinator that cannot build its pipeline at start exits: its pod is never ready,
		// never asked, and named with its error.
		"a surge pod fails to start": {
			replicas: 2, survey: &podSurvey{pods: []podRevision{serving("a", "r2"), serving("b", "r2")},
				failing: []string{"c: exits with code 1, restarted 3 times: coordinator: invalid pipeline in /etc/coordinator/coordinator.yaml: pipeline.steps[0].params.tokenizer: tokenizer.json: unexpected end of JSON input"}},
			status: metav1.ConditionFalse, reason: coordinatorv1alpha1.ReasonProgressing, updated: 2,
			contains: []string{"2 of 2 desired replicas serve revision r2 (2 ready); not starting: c: exits with code 1, restarted 3 times: coordinator: invalid pipeline in /etc/coordinator/coordinator.yaml: pipeline.steps[0].params.tokenizer: tokenizer.json: unexpected end of JSON input"},
		},
		"the only pod fails to start": {
			replicas: 1, survey: &podSurvey{failing: []string{"a: exits with code 1"}},
			status: metav1.ConditionFalse, reason: coordinatorv1alpha1.ReasonProgressing,
			contains: []string{"0 of 1 desired replicas serve revision r2 (0 ready); not starting: a: exits with code 1"},
		},
		"failing pods with a rejection": {
			replicas: 2, survey: &podSurvey{pods: []podRevision{serving("a", "r2"), rejecting("b", "r1", "r2", "boom")}, failing: []string{"c: exits with code 1"}},
			status: metav1.ConditionFalse, reason: coordinatorv1alpha1.ReasonConfigRejected, updated: 1, requeue: rejectedPollInterval,
			contains: []string{"b serves r1: boom", "; not starting: c: exits with code 1"},
		},
		"old and unknown pods": {
			replicas: 2, survey: &podSurvey{pods: []podRevision{serving("a", "r1"), {pod: "b", err: "timeout"}}},
			status: metav1.ConditionFalse, reason: coordinatorv1alpha1.ReasonProgressing, requeue: rolloutPollInterval,
			contains: []string{"not yet: a serves r1", "not asked: b: timeout"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			cp := newPipeline("ns", "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Replicas = ptr.To(tc.replicas) })
			cp.Status.ConfigRevision = "r2"
			cp.Status.ReadyReplicas = tc.replicas
			if tc.depReady != nil {
				cp.Status.ReadyReplicas = *tc.depReady
			}
			got := revisionRolloutOf(cp, tc.survey)
			g.Expect(got.status).To(Equal(tc.status), got.message)
			g.Expect(got.reason).To(Equal(tc.reason), got.message)
			g.Expect(got.updated).To(Equal(tc.updated), got.message)
			g.Expect(got.requeue).To(Equal(tc.requeue), got.message)
			for _, s := range tc.contains {
				g.Expect(got.message).To(ContainSubstring(s))
			}
			for _, s := range tc.notContains {
				g.Expect(got.message).NotTo(ContainSubstring(s))
			}
			g.Expect(len(got.message)).To(BeNumerically("<", 2048))

			setRolledOutCondition(cp, got)
			g.Expect(cp.Status.UpdatedReplicas).To(Equal(tc.updated))
		})
	}
}

func TestServiceURL(t *testing.T) {
	g := NewWithT(t)
	cp := newPipeline("llm-d", "epd")
	g.Expect(serviceURL(cp, nil)).To(Equal("http://epd.llm-d.svc:8080"))
	cfg := config.Default()
	cfg.Server.SecureServing = true
	g.Expect(serviceURL(cp, &cfg)).To(Equal("https://epd.llm-d.svc:8080"))
}

// coordinatorPod is a ready coordinator pod at 127.0.0.1 whose "metrics" port is that of
// rawURL's host, with an HTTPS readiness probe when rawURL is https.
func coordinatorPod(t *testing.T, name, rawURL string) corev1.Pod {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(u.Host)
	n, _ := strconv.Atoi(port)
	scheme := corev1.URISchemeHTTP
	if u.Scheme == "https" {
		scheme = corev1.URISchemeHTTPS
	}
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name:           containerName,
			Ports:          []corev1.ContainerPort{{Name: portName, ContainerPort: ListenPort}, {Name: metricsPortName, ContainerPort: int32(n)}},
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Scheme: scheme}}},
		}}},
		Status: corev1.PodStatus{PodIP: "127.0.0.1", Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
}

type fixedReload reload.Status

func (s fixedReload) Status() reload.Status { return reload.Status(s) }

// The operator reads the data plane's own admin handler: the JSON contract is the data plane's.
func TestSurveyPods(t *testing.T) {
	g := NewWithT(t)
	cfg := config.Default()
	cfg.Gateway.Address = "http://gateway.test:80"
	cfg.Pipeline.Steps = []config.Step{{Type: "decode"}}
	cfg.Canary = config.NewCanary()
	cfg.Canary.WeightPercent = 10
	cfg.Canary.Pipeline.Steps = []config.Step{{Type: "prefill"}, {Type: "decode"}}
	p, err := builder.Build(cfg, builder.Options{Revision: "rev-1"})
	g.Expect(err).NotTo(HaveOccurred())
	holder := &pipeline.Holder{}
	holder.Swap(p)
	canary, _ := p.Canary()
	canary.Tally().Record(true)
	canary.Tally().Record(false)
	p.Tally().Record(false)
	admin := func(st reload.Status) http.Handler {
		return server.AdminHandler(prometheus.NewRegistry(), holder, fixedReload(st))
	}
	good := httptest.NewServer(admin(reload.Status{}))
	defer good.Close()
	rejected := httptest.NewTLSServer(admin(reload.Status{LastError: "pipeline.steps[0].type: unknown", RejectedRevision: "rev-2",
		RestartRequired: []string{"server.read_timeout"}}))
	defer rejected.Close()
	huge := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = fmt.Fprintf(w, `{"revision":"rev-1","pad":"%s"}`, strings.Repeat("x", maxPipelineStatusBytes))
	}))
	defer huge.Close()
	noPipeline := httptest.NewServer(server.AdminHandler(prometheus.NewRegistry(), &pipeline.Holder{}, nil))
	defer noPipeline.Close()
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()

	notReady := coordinatorPod(t, "not-ready", good.URL)
	notReady.Status.Conditions[0].Status = corev1.ConditionFalse
	terminating := coordinatorPod(t, "terminating", good.URL)
	terminating.DeletionTimestamp = ptr.To(metav1.Now())
	noIP := coordinatorPod(t, "no-ip", good.URL)
	noIP.Status.PodIP = ""
	noPort := coordinatorPod(t, "no-port", good.URL)
	noPort.Spec.Containers[0].Ports = noPort.Spec.Containers[0].Ports[:1]
	hostNetwork := coordinatorPod(t, "host-network", good.URL) // its IP is a node's: never asked
	hostNetwork.Spec.HostNetwork = true
	crashed := func(p corev1.Pod) corev1.Pod {
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: containerName, RestartCount: 2,
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Message: "coordinator: boom\n"}}}}
		return p
	}
	crashing := crashed(coordinatorPod(t, "crashing", good.URL))
	crashing.Status.Conditions[0].Status = corev1.ConditionFalse
	crashingTerminating := crashed(terminating)
	crashingTerminating.Name = "crashing-terminating"
	pods := []corev1.Pod{
		coordinatorPod(t, "good", good.URL), coordinatorPod(t, "rejected", rejected.URL), coordinatorPod(t, "huge", huge.URL),
		coordinatorPod(t, "no-pipeline", noPipeline.URL), coordinatorPod(t, "closed", closed.URL),
		notReady, terminating, noIP, noPort, hostNetwork, crashing, crashingTerminating,
	}
	survey := surveyPods(context.Background(), HTTPPipelineStatusGetter{}, pods)
	g.Expect(survey.failing).To(Equal([]string{"crashing: exits with code 1, restarted 2 times: coordinator: boom"}), "not ready, not terminating, failing")
	byName := map[string]podRevision{}
	var names []string
	for _, p := range survey.pods {
		byName[p.pod] = p
		names = append(names, p.pod)
	}
	g.Expect(names).To(Equal([]string{"closed", "good", "huge", "no-pipeline", "no-port", "rejected"}), "ready pods only, by name")
	g.Expect(byName["good"].err).To(BeEmpty())
	g.Expect(byName["good"].status.Revision).To(Equal("rev-1"))
	g.Expect(byName["rejected"].err).To(BeEmpty())
	g.Expect(byName["rejected"].status).To(Equal(PodPipelineStatus{Revision: "rev-1", ConfigSchema: config.SchemaVersion, Reload: &PodReloadStatus{
		LastError: "pipeline.steps[0].type: unknown", RejectedRevision: "rev-2", RestartRequired: []string{"server.read_timeout"}},
		Pipelines: []PodPipelineTrack{
			{Track: config.TrackStable, Revision: cfg.Pipeline.Revision(), Requests: 1},
			{Track: config.TrackCanary, Revision: cfg.Canary.Pipeline.Revision(), Requests: 2, Errors: 1},
		}}))
	g.Expect(byName["huge"].err).To(ContainSubstring("larger than"))
	g.Expect(byName["no-pipeline"].err).To(ContainSubstring("HTTP 503"))
	g.Expect(byName["no-port"].err).To(ContainSubstring(`no container port named "metrics"`))
	g.Expect(byName["closed"].err).To(ContainSubstring("connection refused"))
}

// A pod that does not answer costs at most podProbeTimeout; pods are asked podProbeParallel at
// a time.
func TestSurveyPodsIsBounded(t *testing.T) {
	g := NewWithT(t)
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	defer hang.Close()
	start := time.Now()
	survey := surveyPods(context.Background(), HTTPPipelineStatusGetter{}, []corev1.Pod{coordinatorPod(t, "hang", hang.URL)})
	g.Expect(time.Since(start)).To(BeNumerically("<", podProbeTimeout+time.Second))
	g.Expect(survey.pods).To(HaveLen(1))
	g.Expect(survey.pods[0].err).NotTo(BeEmpty())

	var pods []corev1.Pod
	for i := range 3 * podProbeParallel {
		pods = append(pods, coordinatorPod(t, fmt.Sprintf("pod-%02d", i), "http://127.0.0.1:1"))
	}
	getter := &concurrencyProbe{}
	survey = surveyPods(context.Background(), getter, pods)
	g.Expect(survey.pods).To(HaveLen(len(pods)))
	g.Expect(getter.max.Load()).To(BeNumerically("<=", podProbeParallel))
	g.Expect(getter.max.Load()).To(BeNumerically(">", 1))
}

type concurrencyProbe struct {
	mu       sync.Mutex
	now      int32
	max      atomic.Int32
	requests atomic.Int32
}

func (c *concurrencyProbe) GetPipelineStatus(context.Context, string) (PodPipelineStatus, error) {
	c.mu.Lock()
	c.now++
	if c.now > c.max.Load() {
		c.max.Store(c.now)
	}
	c.mu.Unlock()
	c.requests.Add(1)
	time.Sleep(20 * time.Millisecond)
	c.mu.Lock()
	c.now--
	c.mu.Unlock()
	return PodPipelineStatus{Revision: "r"}, nil
}

// status.revisions: the applied configuration's pipelines, each with the ready pods that report
// its revision on its track and the sums of their counts. Pods that could not be asked, pods on
// other revisions and tracks reported twice add nothing; counts saturate.
func TestRevisionsOf(t *testing.T) {
	cfg := config.Default()
	cfg.Pipeline.Steps = []config.Step{{Type: "decode"}}
	stable := cfg.Pipeline.Revision()
	withCanary := cfg
	withCanary.Canary = config.NewCanary()
	withCanary.Canary.WeightPercent = 5
	withCanary.Canary.Pipeline.Steps = []config.Step{{Type: "prefill"}, {Type: "decode"}}
	canary := withCanary.Canary.Pipeline.Revision()
	reporting := func(pod string, tracks ...PodPipelineTrack) podRevision {
		return podRevision{pod: pod, status: PodPipelineStatus{Revision: "cfg", Pipelines: tracks}}
	}
	type rs = coordinatorv1alpha1.PipelineRevisionStatus
	tests := map[string]struct {
		applied config.Config
		survey  *podSurvey
		want    []rs
	}{
		"no pods yet": {applied: withCanary, want: []rs{
			{Track: "stable", Revision: stable, WeightPercent: 95}, {Track: "canary", Revision: canary, WeightPercent: 5}}},
		"no canary": {applied: cfg, survey: &podSurvey{pods: []podRevision{reporting("a", PodPipelineTrack{Track: "stable", Revision: stable, Requests: 7, Errors: 1})}},
			want: []rs{{Track: "stable", Revision: stable, WeightPercent: 100, Pods: 1, Requests: 7, Errors: 1}}},
		"two pods summed, one unreachable, one on an older pipeline": {applied: withCanary, survey: &podSurvey{pods: []podRevision{
			reporting("a", PodPipelineTrack{Track: "stable", Revision: stable, Requests: 95}, PodPipelineTrack{Track: "canary", Revision: canary, Requests: 5, Errors: 2}),
			reporting("b", PodPipelineTrack{Track: "stable", Revision: stable, Requests: 19}, PodPipelineTrack{Track: "canary", Revision: canary, Requests: 1}),
			{pod: "c", err: "connection refused"},
			reporting("d", PodPipelineTrack{Track: "stable", Revision: "older", Requests: 1000}),
		}}, want: []rs{
			{Track: "stable", Revision: stable, WeightPercent: 95, Pods: 2, Requests: 114},
			{Track: "canary", Revision: canary, WeightPercent: 5, Pods: 2, Requests: 6, Errors: 2}}},
		"the canary's revision reported as stable is not the canary": {applied: withCanary, survey: &podSurvey{pods: []podRevision{
			reporting("a", PodPipelineTrack{Track: "stable", Revision: canary, Requests: 3})}}, want: []rs{
			{Track: "stable", Revision: stable, WeightPercent: 95}, {Track: "canary", Revision: canary, WeightPercent: 5}}},
		"a hostile pod: a track twice, errors above requests, counts that overflow": {applied: cfg, survey: &podSurvey{pods: []podRevision{
			reporting("a", PodPipelineTrack{Track: "stable", Revision: stable, Requests: math.MaxUint64, Errors: math.MaxUint64},
				PodPipelineTrack{Track: "stable", Revision: stable, Requests: 5}),
			reporting("b", PodPipelineTrack{Track: "stable", Revision: stable, Requests: 1, Errors: 9}),
		}}, want: []rs{{Track: "stable", Revision: stable, WeightPercent: 100, Pods: 2, Requests: math.MaxInt64, Errors: math.MaxInt64}}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := revisionsOf(tc.applied, tc.survey); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// A restart of the coordinator container (a pod that fails to start) brings a reconcile, so the
// rollout status names it; other status changes do not.
func TestPodChangedOnRestarts(t *testing.T) {
	g := NewWithT(t)
	pod := coordinatorPod(t, "a", "http://127.0.0.1:9090")
	pod.Status.Conditions[0].Status = corev1.ConditionFalse
	restarted := pod.DeepCopy()
	restarted.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: containerName, RestartCount: 1,
		LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1}}}}
	g.Expect(podChanged(&pod, restarted)).To(BeTrue())
	again := restarted.DeepCopy()
	again.Status.ContainerStatuses[0].RestartCount = 2
	g.Expect(podChanged(restarted, again)).To(BeTrue())
	sameRestarts := again.DeepCopy()
	sameRestarts.Status.ContainerStatuses[0].State.Waiting = &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}
	g.Expect(podChanged(again, sameRestarts)).To(BeFalse())
}

// Which pods the rollout status reads follows controller references: adoption, release and a new
// controller are changes; other owner references are not.
func TestControllerChanged(t *testing.T) {
	ref := func(uid string, controller bool) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs-" + uid, UID: types.UID(uid), Controller: ptr.To(controller)}
	}
	tests := map[string]struct {
		old, cur []metav1.OwnerReference
		want     bool
	}{
		"no owner either time":     {},
		"same controller":          {old: []metav1.OwnerReference{ref("a", true)}, cur: []metav1.OwnerReference{ref("a", true)}},
		"adopted":                  {cur: []metav1.OwnerReference{ref("a", true)}, want: true},
		"released":                 {old: []metav1.OwnerReference{ref("a", true)}, want: true},
		"another controller":       {old: []metav1.OwnerReference{ref("a", true)}, cur: []metav1.OwnerReference{ref("b", true)}, want: true},
		"a non-controlling owner":  {cur: []metav1.OwnerReference{ref("a", false)}},
		"controller becomes owner": {old: []metav1.OwnerReference{ref("a", true)}, cur: []metav1.OwnerReference{ref("a", false)}, want: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			old := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{OwnerReferences: tc.old}}
			cur := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{OwnerReferences: tc.cur}}
			if got := controllerChanged(old, cur); got != tc.want {
				t.Fatalf("controllerChanged = %v, want %v", got, tc.want)
			}
			if got := podChanged(old, cur); got != tc.want {
				t.Fatalf("podChanged = %v, want %v", got, tc.want)
			}
		})
	}
}
