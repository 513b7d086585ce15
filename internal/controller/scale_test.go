package controller

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// scalePipelines is how many CoordinatorPipelines the scale test reconciles at once.
const scalePipelines = 200

// TestScale reconciles 200 CoordinatorPipelines: first to "children created, waiting for the
// Deployment" (Ready=False DeploymentNotReady), then, once the test plays the Deployment
// controller for all of them, to Ready=True, after which a reconcile of each writes nothing and
// emits no event. It logs how long each phase took.
func TestScale(t *testing.T) {
	e := envSuite(t)
	g := gomega(t)
	g.SetDefaultEventuallyTimeout(5 * time.Minute)
	g.SetDefaultEventuallyPollingInterval(250 * time.Millisecond)
	ctx := context.Background()
	ns := e.namespace(t)
	e.createPool(t, ns, "pool")

	start := time.Now()
	forEach(t, scalePipelines, func(i int) error {
		cp := newPipeline(ns, fmt.Sprintf("cpl-%03d", i))
		cp.UID, cp.Generation = "", 0
		return e.client.Create(ctx, cp)
	})
	created := time.Since(start)

	// countReason counts the pipelines whose status is current and whose Ready condition has reason.
	countReason := func(g Gomega, reason coordinatorv1alpha1.ConditionReason) int {
		var list coordinatorv1alpha1.CoordinatorPipelineList
		g.Expect(e.client.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
		n := 0
		for i := range list.Items {
			cp := &list.Items[i]
			ready := meta.FindStatusCondition(cp.Status.Conditions, string(coordinatorv1alpha1.ConditionReady))
			if cp.Status.ObservedGeneration == cp.Generation && ready != nil && ready.Reason == string(reason) && cp.Status.ConfigRevision != "" {
				n++
			}
		}
		return n
	}
	g.Eventually(func(g Gomega) {
		g.Expect(countReason(g, coordinatorv1alpha1.ReasonDeploymentNotReady)).To(Equal(scalePipelines))
	}).Should(Succeed())
	reconciled := time.Since(start)

	rollStart := time.Now()
	forEach(t, scalePipelines, func(i int) error {
		return e.setDeploymentAvailable(ns, fmt.Sprintf("cpl-%03d", i))
	})
	g.Eventually(func(g Gomega) {
		g.Expect(countReason(g, coordinatorv1alpha1.ReasonReady)).To(Equal(scalePipelines))
	}).Should(Succeed())
	ready := time.Since(rollStart)
	total := time.Since(start)

	// Steady: nothing is written any more.
	versions := func(g Gomega) map[string]string {
		var cps coordinatorv1alpha1.CoordinatorPipelineList
		g.Expect(e.client.List(ctx, &cps, client.InNamespace(ns))).To(Succeed())
		var deps appsv1.DeploymentList
		g.Expect(e.client.List(ctx, &deps, client.InNamespace(ns))).To(Succeed())
		var cms corev1.ConfigMapList
		g.Expect(e.client.List(ctx, &cms, client.InNamespace(ns))).To(Succeed())
		out := map[string]string{}
		for _, o := range cps.Items {
			out["cpl/"+o.Name] = o.ResourceVersion
		}
		for _, o := range deps.Items {
			out["deploy/"+o.Name] = o.ResourceVersion
		}
		for _, o := range cms.Items {
			out["cm/"+o.Name] = o.ResourceVersion
		}
		return out
	}
	steady := versions(g)
	g.Expect(steady).To(HaveLen(3 * scalePipelines))
	events := map[int]int{}
	for i := range scalePipelines {
		events[i] = e.events.count(ns, fmt.Sprintf("cpl-%03d", i))
	}
	forEach(t, scalePipelines, func(i int) error {
		_, err := e.reconciler.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: fmt.Sprintf("cpl-%03d", i)}})
		return err
	})
	g.Expect(versions(g)).To(Equal(steady))
	for i := range scalePipelines {
		g.Expect(e.events.count(ns, fmt.Sprintf("cpl-%03d", i))).To(Equal(events[i]), "events about cpl-%03d", i)
	}

	t.Logf("scale: %d CoordinatorPipelines created in %s; all reconciled (4 children each, status DeploymentNotReady) %s after the first create; all Ready %s after their Deployments became available; total %s; then a reconcile of each wrote nothing",
		scalePipelines, created.Round(time.Millisecond), reconciled.Round(time.Millisecond), ready.Round(time.Millisecond), total.Round(time.Millisecond))
}

// forEach runs fn(0..n-1) on 8 workers and fails the test on the first error.
func forEach(t *testing.T, n int, fn func(i int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	work := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := fn(i); err != nil {
					errs <- err
				}
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
