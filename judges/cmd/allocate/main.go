// Command allocate runs the scheduler's own structured allocator
// (k8s.io/dynamic-resource-allocation/structured) once, so the tests allocate claims
// exactly as kube-scheduler's DRA plugin would instead of writing results by hand.
//
// It is a pure function over JSON: stdin holds the world (feature switches, the node,
// the ResourceSlices, the DeviceClasses, the claims to allocate and the claims already
// allocated), stdout gets {"results": {claimUID: AllocationResult}} or {"error": ...}.
// Reading and writing the API server is the caller's job (tests/judges/allocator.py),
// so the same binary serves the fake API server and the real one.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"
)

type input struct {
	// The allocator's feature switches, by their Go field names (AdminAccess,
	// ConsumableCapacity, DeviceTaints, PartitionableDevices, PrioritizedList,
	// DeviceBindingAndStatus, ...): the scheduler derives them from its feature gates.
	Features  json.RawMessage              `json:"features"`
	Node      *v1.Node                     `json:"node"`
	Slices    []*resourceapi.ResourceSlice `json:"slices"`
	Classes   []*resourceapi.DeviceClass   `json:"classes"`
	Claims    []*resourceapi.ResourceClaim `json:"claims"`
	Allocated []*resourceapi.ResourceClaim `json:"allocated"`
}

type output struct {
	Results map[string]resourceapi.AllocationResult `json:"results,omitempty"`
	// Error: the claims cannot be allocated on this node (Unschedulable: true, the
	// scheduler would try another node) or the input is wrong (a CEL error, a
	// missing class: the scheduler reports it and does not retry elsewhere).
	Error         string `json:"error,omitempty"`
	Unschedulable bool   `json:"unschedulable,omitempty"`
}

// classes is the DeviceClassLister the allocator asks; the scheduler's is an informer.
type classes map[string]*resourceapi.DeviceClass

func (c classes) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(c))
	for _, class := range c {
		out = append(out, class)
	}
	return out, nil
}

func (c classes) Get(name string) (*resourceapi.DeviceClass, error) {
	if class, ok := c[name]; ok {
		return class, nil
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclasses"), name)
}

// allocatedState is what the scheduler's claim tracker gathers from allocated claims
// (GatherAllocatedState with foreachAllocatedDevice): admin-access results hold nothing;
// with consumable capacity a result with a share ID holds a share and its consumed
// capacity, not the whole device; without it every result holds its whole device.
func allocatedState(claims []*resourceapi.ResourceClaim, consumable bool) structured.AllocatedState {
	state := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for _, claim := range claims {
		if claim.Status.Allocation == nil {
			continue
		}
		for _, result := range claim.Status.Allocation.Devices.Results {
			if ptr.Deref(result.AdminAccess, false) {
				continue
			}
			id := structured.MakeDeviceID(result.Driver, result.Pool, result.Device)
			if consumable && result.ShareID != nil {
				state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, result.ShareID))
				if result.ConsumedCapacity != nil {
					state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, result.ConsumedCapacity))
				}
				continue
			}
			state.AllocatedDevices.Insert(id)
		}
	}
	return state
}

func run(in input) output {
	if in.Node == nil {
		return output{Error: "input has no node"}
	}
	var features structured.Features
	dec := json.NewDecoder(bytes.NewReader(in.Features))
	dec.DisallowUnknownFields() // a misspelt feature name must not pass silently
	if len(in.Features) > 0 {
		if err := dec.Decode(&features); err != nil {
			return output{Error: fmt.Sprintf("features: %v", err)}
		}
	}
	ctx := context.Background()
	lister := classes{}
	for _, class := range in.Classes {
		lister[class.Name] = class
	}
	celCache := cel.NewCache(10, cel.Features{EnableConsumableCapacity: features.ConsumableCapacity})
	state := allocatedState(in.Allocated, features.ConsumableCapacity)
	allocator, err := structured.NewAllocator(ctx, features, state, lister, in.Slices, celCache)
	if err != nil {
		return output{Error: err.Error()}
	}
	results, err := allocator.Allocate(ctx, in.Node, in.Claims)
	if err != nil {
		return output{Error: err.Error(), Unschedulable: errors.Is(err, structured.ErrFailedAllocationOnNode)}
	}
	if results == nil {
		// The allocator's "cannot be allocated here" without a reason.
		return output{Error: "cannot allocate all claims on node " + in.Node.Name, Unschedulable: true}
	}
	out := output{Results: map[string]resourceapi.AllocationResult{}}
	for i, claim := range in.Claims {
		out.Results[string(claim.UID)] = results[i]
	}
	return out
}

func main() {
	var in input
	var out output
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		out = output{Error: fmt.Sprintf("reading the input: %v", err)}
	} else {
		out = run(in)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if out.Error != "" && !out.Unschedulable {
		os.Exit(1)
	}
}
