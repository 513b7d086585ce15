// Package ec implements the encoder-cache (EC) transfer protocols: how the ec_transfer_params that
// encode workers return are merged into the single map the prefill leg carries.
package ec

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
)

// Connector names.
const (
	NIXL          = "ec-nixl"
	SharedStorage = "ec-shared-storage"
)

// Connector is one EC transfer protocol.
type Connector interface {
	// Name is the configuration name, e.g. ec-nixl.
	Name() string
	// Merge folds one encode answer's ec_transfer_params into acc (keyed by mm_hash).
	Merge(acc map[string]any, fromEncode map[string]any) error
}

// Names lists the known connectors.
func Names() []string {
	n := []string{NIXL, SharedStorage}
	sort.Strings(n)
	return n
}

// New returns the connector called name.
func New(name string) (Connector, error) {
	switch name {
	case NIXL:
		return nixl{}, nil
	case SharedStorage:
		return sharedStorage{}, nil
	}
	return nil, fmt.Errorf("unknown EC connector %q (known: %s)", name, strings.Join(Names(), ", "))
}

// ErrConflict is returned when two encode answers disagree about one mm_hash.
type ErrConflict struct{ Hash string }

func (e *ErrConflict) Error() string {
	return fmt.Sprintf("conflicting ec_transfer_params descriptors for mm_hash %q", e.Hash)
}

// nixl merges per-mm_hash descriptors ({peer_host, peer_port, size_bytes, nixl_agent_metadata_b64}).
// A null descriptor is dropped; identical duplicates are kept once; differing ones are an error.
type nixl struct{}

func (nixl) Name() string { return NIXL }

func (nixl) Merge(acc, fromEncode map[string]any) error {
	for hash, desc := range fromEncode {
		if desc == nil {
			continue
		}
		if prev, ok := acc[hash]; ok {
			if !reflect.DeepEqual(prev, desc) {
				return &ErrConflict{Hash: hash}
			}
			continue
		}
		acc[hash] = desc
	}
	return nil
}

// sharedStorage keeps embeddings in shared storage keyed by mm_hash: nothing travels on the wire.
type sharedStorage struct{}

func (sharedStorage) Name() string { return SharedStorage }

func (sharedStorage) Merge(map[string]any, map[string]any) error { return nil }
