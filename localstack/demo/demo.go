// Package demo is the local stack's demo data: one node, one reservation with units on the
// spot market and VMs on them, and an API key for each kind of caller.
package demo

import (
	"time"

	"github.com/openrelay/capacity/shared/auth"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
)

// Key is a demo API key and who it stands for.
type Key struct {
	Name   string // what the key shows off
	Secret string
	Key    capacity.APIKey
}

// Orgs of the demo.
const (
	OrgPlatform = "org-platform" // operator
	OrgOwner    = "org-owner"    // owns the node
	OrgManager  = "org-manager"  // in managingOrgIds
	OrgAudience = "org-audience" // in allowedOrgIds only
	OrgBuyer    = "org-buyer"    // buys spot
)

// IDs of the demo node and reservation.
const (
	NodeID        = "node-a"
	ReservationID = "res-1"
)

// Secrets of the demo keys, in the one accepted key format (capacity.CheckKeySecret). They are
// fixed so that the README's examples work; they exist only in the local stack.
const (
	OperatorSecret  = "ocap_demoOperator000000000000000000000000000000020pbNU"
	SchedulerSecret = "ocap_demoScheduler0000000000000000000000000000001jmSvo"
	OwnerSecret     = "ocap_demoOwner00000000000000000000000000000000000lf45s"
	ManagerSecret   = "ocap_demoManager000000000000000000000000000000000Mc1OA"
	AudienceSecret  = "ocap_demoAudience00000000000000000000000000000002xzbhP"
	ReadOnlySecret  = "ocap_demoReadonly00000000000000000000000000000000krpmi"
)

// Keys returns the demo API keys.
func Keys() []Key {
	all := []string{capacity.PermCapacity, capacity.PermRead}
	mk := func(name, secret, org string, operator bool, perms ...string) Key {
		return Key{Name: name, Secret: secret, Key: capacity.APIKey{
			KeyID: "key-" + name, Hash: auth.Hash(secret), OrgID: org, Operator: operator, Permissions: perms,
		}}
	}
	return []Key{
		// The platform operator holds every permission; the marketplace scheduler, an operator
		// key too, only places VMs (it gets 404 on every operator route).
		mk("operator", OperatorSecret, OrgPlatform, true, capacity.AllPermissions...),
		mk("scheduler", SchedulerSecret, OrgPlatform, true, capacity.PermPlace),
		mk("owner", OwnerSecret, OrgOwner, false, all...),
		mk("manager", ManagerSecret, OrgManager, false, all...),
		mk("audience", AudienceSecret, OrgAudience, false, all...),
		mk("no-capacity", ReadOnlySecret, OrgOwner, false, capacity.PermRead),
	}
}

// Seed returns the demo data as of now:
//
//	node-a: gpu-0..gpu-7, owned by org-owner
//	res-1:  reserves gpu-0..gpu-5 for org-audience, managed by org-manager; gpu-2..gpu-5 released
//	vm-spot-1  spot      gpu-2        org-buyer
//	vm-spot-2  spot      gpu-3,gpu-6  org-buyer (spans a reserved and an unreserved unit)
//	vm-res-1   reserved  gpu-0        org-audience
//	vm-od-1    on-demand gpu-7        org-buyer
func Seed(now time.Time) dynamo.Seed {
	now = now.UTC().Truncate(time.Second)
	start, end := now.Add(-24*time.Hour), now.Add(30*24*time.Hour)
	vm := func(id string, tier capacity.Tier, org string, units ...string) capacity.VM {
		return capacity.VM{ID: id, NodeID: NodeID, OrgID: org, Tier: tier, UnitIDs: units,
			State: capacity.VMRunning, CreatedAt: start, UpdatedAt: start, Version: 1}
	}
	s := dynamo.Seed{
		Nodes: []capacity.Node{{
			ID: NodeID, OwnerOrgID: OrgOwner, TopologyGen: 1, AgentEndpoint: "http://127.0.0.1:0",
			UnitIDs: []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"}, Version: 1,
		}},
		Reservations: []capacity.Reservation{{
			ID: ReservationID, NodeID: NodeID, AllowedOrgIDs: []string{OrgAudience}, ManagingOrgIDs: []string{OrgManager},
			ReservedUnitIDs: []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5"},
			ReleasedUnitIDs: []string{"gpu-2", "gpu-3", "gpu-4", "gpu-5"},
			StartsAt:        start, EndsAt: &end, Status: capacity.StatusActive, ContractRef: "demo-contract-1",
			CreatedAt: start, UpdatedAt: start, TopologyGen: 1, Version: 1,
		}},
		VMs: []capacity.VM{
			vm("vm-spot-1", capacity.TierSpot, OrgBuyer, "gpu-2"),
			vm("vm-spot-2", capacity.TierSpot, OrgBuyer, "gpu-3", "gpu-6"),
			vm("vm-res-1", capacity.TierReserved, OrgAudience, "gpu-0"),
			vm("vm-od-1", capacity.TierOnDemand, OrgBuyer, "gpu-7"),
		},
	}
	for _, k := range Keys() {
		k.Key.CreatedAt = now // the API shows when a key was made; these are made by the seed
		s.Keys = append(s.Keys, k.Key)
	}
	return s
}
