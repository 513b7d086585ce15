// Package v1alpha1 contains the v1alpha1 API of the coordinator.epd.dev group: the
// CoordinatorPipeline resource, from which the operator renders the data-plane configuration and
// runs the coordinator Deployment.
//
// +kubebuilder:object:generate=true
// +groupName=coordinator.epd.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "coordinator.epd.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this API with a scheme (apimachinery's builder, so the
	// API package depends on apimachinery only).
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types of this API to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &CoordinatorPipeline{}, &CoordinatorPipelineList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
