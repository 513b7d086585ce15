package controller

import (
	"encoding/json"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

const testGateway = "http://inference-gateway.infra.svc:80"

// newPipeline returns a valid CoordinatorPipeline (conditional-decode, prefill, decode against an
// explicit gateway address) with the CRD defaults filled in, after applying mutate.
func newPipeline(namespace, name string, mutate ...func(*coordinatorv1alpha1.CoordinatorPipeline)) *coordinatorv1alpha1.CoordinatorPipeline {
	cp := &coordinatorv1alpha1.CoordinatorPipeline{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: "test-uid", Generation: 1},
		Spec: coordinatorv1alpha1.CoordinatorPipelineSpec{
			InferencePoolRef: coordinatorv1alpha1.InferencePoolReference{Name: "pool"},
			Gateway:          coordinatorv1alpha1.GatewaySpec{Address: testGateway},
			Pipeline: coordinatorv1alpha1.PipelineSpec{
				KVConnector:     coordinatorv1alpha1.KVConnectorNIXL,
				ECConnector:     coordinatorv1alpha1.ECConnectorSharedStorage,
				UseOpenAIFormat: ptr.To(true),
				Steps: []coordinatorv1alpha1.PipelineStep{
					{Type: coordinatorv1alpha1.StepConditionalDecode},
					{Type: coordinatorv1alpha1.StepPrefill},
					{Type: coordinatorv1alpha1.StepDecode},
				},
			},
			Replicas: ptr.To[int32](1),
			LogLevel: 2,
		},
	}
	for _, m := range mutate {
		m(cp)
	}
	return cp
}

// params encodes step params for a PipelineStep.
func params(v map[string]any) *apiextensionsv1.JSON {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return &apiextensionsv1.JSON{Raw: b}
}

func duration(s string) *metav1.Duration {
	d, err := time.ParseDuration(s)
	if err != nil {
		panic(err)
	}
	return &metav1.Duration{Duration: d}
}
