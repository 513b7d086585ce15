package controller

import (
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// NewScheme registers every kind the operator reads or writes: the built-in kinds, the
// CoordinatorPipeline, GAIE's InferencePool and Gateway API's Gateway and HTTPRoute.
func NewScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(coordinatorv1alpha1.AddToScheme(s))
	utilruntime.Must(infv1.Install(s))
	utilruntime.Must(gatewayv1.Install(s))
	return s
}
