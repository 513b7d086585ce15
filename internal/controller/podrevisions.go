package controller

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// Rollout truth: the coordinators reload their configuration without a restart, so neither the
// Deployment nor the pods' objects say which configuration a pod serves. The operator asks each
// ready coordinator pod on its admin port (GET /debug/pipeline, the port named "metrics").

const (
	// DebugPipelinePath is the coordinator admin listener's pipeline report.
	DebugPipelinePath = "/debug/pipeline"
	// podProbeTimeout bounds one pod's answer.
	podProbeTimeout = 2 * time.Second
	// podProbeBudget bounds the whole survey of one pipeline's pods: a pod not asked by then is
	// unknown.
	podProbeBudget = 5 * time.Second
	// podProbeParallel is how many pods of one pipeline are asked at once.
	podProbeParallel = 8
	// maxPipelineStatusBytes bounds the answer read from a pod.
	maxPipelineStatusBytes = 1 << 20
)

// PodPipelineStatus is the part of a coordinator's GET /debug/pipeline answer
// (server.PipelineStatus) the operator reads. A test keeps the two in step.
type PodPipelineStatus struct {
	// Revision is the configuration revision the pod serves.
	Revision string `json:"revision"`
	// ConfigSchema is the configuration schema the pod's coordinator reads (0: a coordinator
	// from before it reported one).
	ConfigSchema int `json:"config_schema,omitempty"`
	// Reload is the pod's config watcher (absent when it does not watch the file).
	Reload *PodReloadStatus `json:"reload,omitempty"`
	// Pipelines are the pipelines the pod serves (the stable one and its canary), with what
	// each served.
	Pipelines []PodPipelineTrack `json:"pipelines,omitempty"`
}

// PodPipelineTrack is the part of a coordinator's server.PipelineTrack the operator reads.
type PodPipelineTrack struct {
	// Track is stable or canary; Revision the pipeline revision.
	Track    string `json:"track"`
	Revision string `json:"revision"`
	// Requests and Errors are what the pod ran on the revision since it loaded it.
	Requests uint64 `json:"requests"`
	Errors   uint64 `json:"errors"`
}

// PodReloadStatus is the part of the coordinator's reload.Status the operator reads.
type PodReloadStatus struct {
	// LastError is the last rejected configuration's error ("" after a success).
	LastError string `json:"last_error,omitempty"`
	// RejectedRevision is the revision that LastError rejected.
	RejectedRevision string `json:"rejected_revision,omitempty"`
	// RestartRequired lists settings of the loaded file that wait for a restart.
	RestartRequired []string `json:"restart_required,omitempty"`
}

// PipelineStatusGetter asks one coordinator for its GET /debug/pipeline answer at url. The
// reconciler's default is HTTPPipelineStatusGetter; tests may substitute their own.
type PipelineStatusGetter interface {
	GetPipelineStatus(ctx context.Context, url string) (PodPipelineStatus, error)
}

// HTTPPipelineStatusGetter is the PipelineStatusGetter over HTTP(S).
type HTTPPipelineStatusGetter struct {
	// Client sends the requests (NewPodHTTPClient when nil).
	Client *http.Client
}

// NewPodHTTPClient is the client that asks coordinator pods: no proxy (pod IPs are reached
// directly), podProbeTimeout per request, and certificates not verified. The admin listener
// serves the pipeline's TLS certificate (spec.server.tls), issued for the Service's names, not
// for pod IPs, and the operator never reads Secrets' data to learn its CA; what it reads is only
// reported in status.
func NewPodHTTPClient() *http.Client {
	return &http.Client{
		Timeout: podProbeTimeout,
		Transport: &http.Transport{
			Proxy:                 nil,
			DialContext:           (&net.Dialer{Timeout: podProbeTimeout}).DialContext,
			TLSClientConfig:       &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}, //nolint:gosec // see the comment above
			TLSHandshakeTimeout:   podProbeTimeout,
			ResponseHeaderTimeout: podProbeTimeout,
			MaxIdleConnsPerHost:   1,
			IdleConnTimeout:       30 * time.Second,
		},
		// The admin listener does not redirect; following one would leave the pod.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// GetPipelineStatus implements PipelineStatusGetter: one GET, its answer read up to
// maxPipelineStatusBytes.
func (g HTTPPipelineStatusGetter) GetPipelineStatus(ctx context.Context, url string) (PodPipelineStatus, error) {
	var st PodPipelineStatus
	hc := g.Client
	if hc == nil {
		hc = defaultPodHTTPClient
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return st, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return st, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxPipelineStatusBytes+1))
	if err != nil {
		return st, fmt.Errorf("reading the answer: %w", err)
	}
	switch {
	case resp.StatusCode != http.StatusOK:
		return st, fmt.Errorf("HTTP %d", resp.StatusCode)
	case len(body) > maxPipelineStatusBytes:
		return st, fmt.Errorf("answer larger than %d bytes", maxPipelineStatusBytes)
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return st, fmt.Errorf("decoding the answer: %w", err)
	}
	if st.Revision == "" {
		return st, errors.New("the answer names no revision")
	}
	return st, nil
}

var defaultPodHTTPClient = NewPodHTTPClient()

// podRevision is what one ready coordinator pod said about the configuration it serves.
type podRevision struct {
	// pod is the pod's name.
	pod string
	// status is its answer; valid when err is "".
	status PodPipelineStatus
	// err says why the pod could not be asked ("" when it answered).
	err string
}

// podSurvey is what the operator learned from a pipeline's coordinator pods.
type podSurvey struct {
	// pods are the ready pods, by name, with their answers.
	pods []podRevision
	// failing are the pods that are not ready because their coordinator container exits with an
	// error, e.g. it cannot build its pipeline at start (the tokenizer files of a volume do not
	// load): "<pod>: <startFailure>", by name. They cannot be asked: they never serve.
	failing []string
}

// startFailure says why pod p's coordinator container keeps failing, from its last termination
// with a non-zero exit code ("" when it has none): the code, the kubelet's reason when it is not
// the generic Error (OOMKilled...), the restarts, and the last line of the termination message.
// With the FallbackToLogsOnError policy (pods with spec.tokenizers) that is the end of the
// container's log, whose last line is the coordinator's start-up error ("coordinator: invalid
// pipeline in ...: pipeline.steps[1].params.tokenizer: ...").
func startFailure(p *corev1.Pod) string {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name != containerName {
			continue
		}
		t := cs.LastTerminationState.Terminated
		if cs.State.Terminated != nil {
			t = cs.State.Terminated
		}
		if t == nil || t.ExitCode == 0 {
			return ""
		}
		msg := fmt.Sprintf("exits with code %d", t.ExitCode)
		if t.Reason != "" && t.Reason != "Error" {
			msg += " (" + t.Reason + ")"
		}
		if cs.RestartCount > 0 {
			msg += fmt.Sprintf(", restarted %d times", cs.RestartCount)
		}
		if line := lastLine(t.Message); line != "" {
			msg += ": " + truncate(line, rolloutErrorLen)
		}
		return msg
	}
	return ""
}

// lastLine is the last non-blank line of s, trimmed.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// readyPod reports whether p counts as a serving coordinator: not terminating, Ready, with an
// IP of its own (a hostNetwork pod's IP is its node's, and the operator renders none: such a pod
// carrying the labels is not a coordinator, and is not asked).
func readyPod(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.PodIP == "" || p.Spec.HostNetwork {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// adminURL is the GET /debug/pipeline URL of pod p: its IP and the container port named
// "metrics" of the coordinator container, https when the container's readiness probe uses
// HTTPS (spec.server.tls serves both listeners with TLS). Each pod is read on its own: during a
// roll old and new pods may differ.
func adminURL(p *corev1.Pod) (string, error) {
	for i := range p.Spec.Containers {
		c := &p.Spec.Containers[i]
		if c.Name != containerName && len(p.Spec.Containers) > 1 {
			continue
		}
		for _, port := range c.Ports {
			if port.Name != metricsPortName {
				continue
			}
			scheme := "http"
			if rp := c.ReadinessProbe; rp != nil && rp.HTTPGet != nil && rp.HTTPGet.Scheme == corev1.URISchemeHTTPS {
				scheme = "https"
			}
			return scheme + "://" + net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(port.ContainerPort))) + DebugPipelinePath, nil
		}
	}
	return "", fmt.Errorf("no container port named %q (the admin listener is off?)", metricsPortName)
}

// surveyPods asks every ready pod of pods, at most podProbeParallel at once, each within
// podProbeTimeout and all within podProbeBudget. A pod that cannot be asked is recorded with
// the reason; nothing here fails.
func surveyPods(ctx context.Context, getter PipelineStatusGetter, pods []corev1.Pod) podSurvey {
	ctx, cancel := context.WithTimeout(ctx, podProbeBudget)
	defer cancel()
	var ready []*corev1.Pod
	var failing []string
	for i := range pods {
		p := &pods[i]
		switch {
		case readyPod(p):
			ready = append(ready, p)
		case p.DeletionTimestamp == nil && !p.Spec.HostNetwork:
			if why := startFailure(p); why != "" {
				failing = append(failing, p.Name+": "+why)
			}
		}
	}
	slices.Sort(failing)
	out := make([]podRevision, len(ready))
	sem := make(chan struct{}, podProbeParallel)
	var wg sync.WaitGroup
	for i, p := range ready {
		out[i].pod = p.Name
		url, err := adminURL(p)
		if err != nil {
			out[i].err = err.Error()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
				defer func() { <-sem }()
			case <-ctx.Done():
				out[i].err = "not asked in time"
				return
			}
			pctx, pcancel := context.WithTimeout(ctx, podProbeTimeout)
			defer pcancel()
			st, err := getter.GetPipelineStatus(pctx, url)
			if err != nil {
				out[i].err = err.Error()
				return
			}
			out[i].status = st
		}()
	}
	wg.Wait()
	slices.SortFunc(out, func(a, b podRevision) int { return cmp.Compare(a.pod, b.pod) })
	return podSurvey{pods: out, failing: failing}
}

// listPods lists the pods of dep, cp's coordinator Deployment, from the manager's cache: the pods
// a ReplicaSet controlled by dep controls (the current one and, during a roll, the older ones).
// The selector labels only narrow the lists: a pod or ReplicaSet that carries them but belongs
// to no such owner, e.g. one a user created, is neither asked nor counted.
func (r *CoordinatorPipelineReconciler) listPods(ctx context.Context, cp *coordinatorv1alpha1.CoordinatorPipeline, dep *appsv1.Deployment) ([]corev1.Pod, error) {
	opts := []client.ListOption{client.InNamespace(cp.Namespace), client.MatchingLabels(selectorLabels(cp))}
	var sets appsv1.ReplicaSetList
	if err := r.List(ctx, &sets, opts...); err != nil {
		return nil, fmt.Errorf("listing coordinator ReplicaSets: %w", err)
	}
	owners := map[types.UID]bool{}
	for i := range sets.Items {
		if controlledBy(&sets.Items[i], dep.UID) {
			owners[sets.Items[i].UID] = true
		}
	}
	var list corev1.PodList
	if err := r.List(ctx, &list, opts...); err != nil {
		return nil, fmt.Errorf("listing coordinator pods: %w", err)
	}
	pods := list.Items[:0]
	for i := range list.Items {
		if ref := metav1.GetControllerOfNoCopy(&list.Items[i]); ref != nil && owners[ref.UID] {
			pods = append(pods, list.Items[i])
		}
	}
	return pods, nil
}

// controlledBy reports whether obj's controller reference names the object with the given UID.
func controlledBy(obj metav1.Object, owner types.UID) bool {
	ref := metav1.GetControllerOfNoCopy(obj)
	return ref != nil && owner != "" && ref.UID == owner
}

// reconcilePodRevisions asks the coordinator pods which configuration they serve (no
// Deployment: nothing to ask).
func (r *CoordinatorPipelineReconciler) reconcilePodRevisions(ctx context.Context, s *scope) error {
	dep := s.obs.deployment.value
	if dep == nil {
		s.obs.pods = found[*podSurvey](nil)
		return nil
	}
	pods, err := r.listPods(ctx, s.cp, dep)
	if err != nil {
		return err
	}
	getter := r.PipelineStatus
	if getter == nil {
		getter = HTTPPipelineStatusGetter{}
	}
	survey := surveyPods(ctx, getter, pods)
	s.obs.pods = found(&survey)
	return nil
}

// podChanged is true when an update changes what the rollout status reads of a pod: readiness,
// IP, ports, deletion, labels, its controller (a ReplicaSet adopting or releasing it), or a
// restart of its coordinator container.
func podChanged(old, cur *corev1.Pod) bool {
	if readyPod(old) != readyPod(cur) || old.Status.PodIP != cur.Status.PodIP ||
		(old.DeletionTimestamp == nil) != (cur.DeletionTimestamp == nil) || controllerChanged(old, cur) ||
		startFailure(old) != startFailure(cur) { // a failed start's message counts its restarts
		return true
	}
	if len(old.Labels) != len(cur.Labels) {
		return true
	}
	for k, v := range cur.Labels {
		if old.Labels[k] != v {
			return true
		}
	}
	a, _ := adminURL(old)
	b, _ := adminURL(cur)
	return a != b
}
