// Package v1alpha1 contains the v1alpha1 API of the coordinator.epd.dev group: the
// CoordinatorPipeline resource, from which the operator renders the data-plane configuration and
// runs the coordinator Deployment.
//
// +kubebuilder:object:generate=true
// +groupName=coordinator.epd.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "coordinator.epd.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this API with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types of this API to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
