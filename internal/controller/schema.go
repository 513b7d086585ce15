package controller

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/epd-dev/coordinator/dataplane/base/config"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// AnnotationConfigSchema is the annotation of a CoordinatorPipeline that sets spec.image stating
// the configuration schema version that image reads (its OCI label of the same name, or
// `coordinator --version`). The operator renders only keys of the schema a configuration needs
// (config.NeededSchema); it refuses an image that declares an older one.
const AnnotationConfigSchema = config.SchemaLabel

// schemaError is the refusal of a coordinator image that cannot read what the operator renders.
// It is reported as PipelineValid=False, reason ConfigSchemaUnsupported; the ConfigMap and the
// Deployment (image included) are left as they are.
type schemaError struct {
	image string
	// declared is the annotation's value, have its number and renders the operator's schema;
	// malformed when declared is not a number.
	declared      string
	have, renders int
	malformed     bool
	// needs is the configuration key that needs schema renders ("" when the operator's own
	// schema is checked).
	needs string
}

func (e *schemaError) Error() string {
	if e.malformed {
		return fmt.Sprintf("annotation %s: %q is not a schema version (an integer, the image's %s label; 0 for an image without it); spec.image %s is not run until it is fixed",
			AnnotationConfigSchema, e.declared, config.SchemaLabel, e.image)
	}
	if e.needs != "" {
		return fmt.Sprintf("spec.image %s reads configuration schema %d (annotation %s), older than schema %d that the key %s of this pipeline needs: "+
			"use a coordinator image of schema %d or later (and update the annotation), remove what needs it, or unset spec.image; "+
			"the coordinators keep their current image and configuration until then",
			e.image, e.have, AnnotationConfigSchema, e.renders, e.needs, e.renders)
	}
	return fmt.Sprintf("spec.image %s reads configuration schema %d (annotation %s), older than schema %d that this operator renders: "+
		"use a coordinator image of schema %d or later (and update the annotation), or unset spec.image; "+
		"the coordinators keep their current image and configuration until then",
		e.image, e.have, AnnotationConfigSchema, e.renders, e.renders)
}

// checkImageSchema returns a *schemaError when cp's coordinator image declares a configuration
// schema older than renders, the one the rendered configuration needs (config.NeededSchema;
// needs names its key), or the operator's config.SchemaVersion. The default
// image (no spec.image) is the operator's own release and reads its schema; so does a spec.image
// without the annotation (the operator cannot inspect image labels: stating the schema is how a
// custom image is checked). Schema 0 is an image from before schemas were versioned (no label).
// A newer schema is fine: schemas only add keys.
func checkImageSchema(cp *coordinatorv1alpha1.CoordinatorPipeline, renders int, needs string) error {
	if cp.Spec.Image == "" {
		return nil
	}
	v, ok := cp.Annotations[AnnotationConfigSchema]
	if !ok {
		return nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 0 {
		return &schemaError{image: cp.Spec.Image, declared: v, renders: renders, malformed: true, needs: needs}
	}
	if n < renders {
		return &schemaError{image: cp.Spec.Image, declared: v, have: n, renders: renders, needs: needs}
	}
	return nil
}

// imageRefused reports whether err (the pipeline result) refuses the coordinator image.
func imageRefused(err error) bool {
	var se *schemaError
	return errors.As(err, &se)
}
