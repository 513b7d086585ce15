package e2e

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/test/harness/cluster"
)

// TestCanaryCatchesABadPipeline: a CoordinatorPipeline with a 25% canary that adds a prefill
// stage, served by two real coordinator processes. Every request runs wholly on one pipeline
// (its legs all carry that pipeline's revision) and the operator sums what the pods report in
// status.revisions. Then the prefill pool dies: only the canary's share fails (503, its
// on_pool_failure is fail), the stable requests all succeed, and status.revisions and the
// coordinators' metrics show the canary's errors.
func TestCanaryCatchesABadPipeline(t *testing.T) {
	e := setUp(t)
	const namespace, name = "canary", "epd"
	k := e.cluster.Client
	pool := e.simPool(namespace)
	cp := &coordinatorv1alpha1.CoordinatorPipeline{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: coordinatorv1alpha1.CoordinatorPipelineSpec{
			Replicas:         ptr.To[int32](2),
			InferencePoolRef: coordinatorv1alpha1.InferencePoolReference{Name: pool.Name},
			Gateway:          coordinatorv1alpha1.GatewaySpec{Address: e.gateway.url},
			Pipeline: coordinatorv1alpha1.PipelineSpec{
				KVConnector: "kv-nixl",
				Steps:       []coordinatorv1alpha1.PipelineStep{{Type: "decode"}},
			},
			Canary: &coordinatorv1alpha1.CanarySpec{WeightPercent: 25, Pipeline: coordinatorv1alpha1.PipelineSpec{
				KVConnector:   "kv-nixl",
				OnPoolFailure: coordinatorv1alpha1.PoolFailurePolicy(config.OnPoolFailureFail),
				Steps:         []coordinatorv1alpha1.PipelineStep{{Type: "prefill"}, {Type: "decode"}},
			}},
		},
	}
	if err := k.Create(e.ctx, cp); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "etc-coordinator")
	e.waitFor("a rendered configuration", 30*time.Second, func() (bool, error) {
		return e.pipeline(namespace, name).Status.ConfigRevision != "", nil
	})
	mount, err := e.cluster.MountConfigMap(e.ctx, namespace, name+"-config", dir, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer mount.Stop()
	var coords []*cluster.Coordinator
	for _, pod := range []string{"a", "b"} {
		co, err := cluster.StartCoordinator(e.ctx, e.bin, filepath.Join(dir, "coordinator.yaml"), "", nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = co.Stop(10 * time.Second) }()
		e.podFor(namespace, name, name+"-"+pod, co)
		coords = append(coords, co)
	}
	e.deploymentReady(namespace, name)
	got := e.waitRollout(namespace, name, 1, metav1.ConditionTrue, coordinatorv1alpha1.ReasonRolledOut, 2)
	if len(got.Status.Revisions) != 2 {
		t.Fatalf("status.revisions %+v", got.Status.Revisions)
	}
	stable, canary := got.Status.Revisions[0], got.Status.Revisions[1]
	if stable.Track != "stable" || stable.WeightPercent != 75 || canary.Track != "canary" || canary.WeightPercent != 25 || stable.Revision == canary.Revision {
		t.Fatalf("status.revisions %+v", got.Status.Revisions)
	}

	// 8 requests on each pod: 2 of each 8 on the canary, whose legs are prefill and decode.
	ask := func(co *cluster.Coordinator, i int) (string, int) {
		var resp *http.Response
		sdk := openai.NewClient(option.WithBaseURL(co.URL+"/v1/"), option.WithAPIKey("k"), option.WithMaxRetries(0),
			option.WithRequestTimeout(20*time.Second))
		_, err := sdk.Chat.Completions.New(e.ctx, chat(fmt.Sprintf("canary %d", i)), option.WithResponseInto(&resp))
		if resp == nil {
			t.Fatalf("no answer: %v", err)
		}
		return resp.Header.Get("X-Request-Id"), resp.StatusCode
	}
	onTrack := map[string]int{}
	for i := range 16 {
		id, status := ask(coords[i%2], i)
		if status != http.StatusOK {
			t.Fatalf("request %d: HTTP %d", i, status)
		}
		e.gateway.mu.Lock()
		recorded := e.gateway.legs[id]
		e.gateway.mu.Unlock()
		var profiles []string
		for _, l := range recorded {
			if l.revision != recorded[0].revision {
				t.Fatalf("request %s: legs on revisions %s and %s", id, recorded[0].revision, l.revision)
			}
			profiles = append(profiles, l.profile)
		}
		switch legs := strings.Join(profiles, ","); {
		case recorded[0].revision == canary.Revision && legs == "prefill,decode":
			onTrack["canary"]++
		case recorded[0].revision == stable.Revision && legs == "decode":
			onTrack["stable"]++
		default:
			t.Fatalf("request %s: legs %s on revision %s", id, legs, recorded[0].revision)
		}
	}
	if onTrack["canary"] != 4 || onTrack["stable"] != 12 {
		t.Fatalf("tracks %v: want 4 on the canary, 12 stable", onTrack)
	}
	e.waitRevisions(namespace, name, "the pods' counts", [2]int64{12, 0}, [2]int64{4, 0})

	// The prefill pool dies: the canary's quarter fails, the stable requests do not.
	for _, w := range e.stack.Prefill {
		w.Kill()
	}
	statuses := map[int]int{}
	for i := range 16 {
		_, status := ask(coords[i%2], 100+i)
		statuses[status]++
	}
	if statuses[http.StatusOK] != 12 || statuses[http.StatusServiceUnavailable] != 4 {
		t.Fatalf("statuses %v: want 12 OK (stable) and 4 × 503 (the canary's share)", statuses)
	}
	e.waitRevisions(namespace, name, "the canary's errors", [2]int64{24, 0}, [2]int64{8, 4})
	for _, co := range coords {
		resp, err := http.Get(co.AdminURL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := fmt.Sprintf(`coordinator_pipeline_requests_total{outcome="error",revision=%q,track="canary"} 2`, canary.Revision)
		if !strings.Contains(string(body), want) {
			t.Fatalf("a coordinator's metrics lack %s", want)
		}
	}
}

// waitRevisions waits until status.revisions reports, for the stable and canary tracks, the
// {requests, errors} given, from both pods.
func (e *env) waitRevisions(namespace, name, what string, stable, canary [2]int64) {
	e.t.Helper()
	e.waitFor(what+" in status.revisions", 60*time.Second, func() (bool, error) {
		r := e.pipeline(namespace, name).Status.Revisions
		ok := len(r) == 2 && r[0].Pods == 2 && r[1].Pods == 2 &&
			r[0].Requests == stable[0] && r[0].Errors == stable[1] && r[1].Requests == canary[0] && r[1].Errors == canary[1]
		return ok, fmt.Errorf("status.revisions %+v", r)
	})
}
