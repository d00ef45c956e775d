package main

import (
	"strings"
	"testing"
)

// TestFloorOnlyLocally: the floor writes whatever it is sent, unauthenticated, so no
// environment but local has the function, its role or its route.
func TestFloorOnlyLocally(t *testing.T) {
	for _, env := range []string{"local", "dev", "staging", "prod"} {
		t.Run(env, func(t *testing.T) {
			tp := synth(t, env)
			var floors []string
			for id, fn := range tp.resources("AWS::Lambda::Function") {
				if strings.Contains(toJSON(props(fn)["FunctionName"]), "floor") {
					floors = append(floors, id)
				}
			}
			var routes []string
			for id, r := range tp.resources("AWS::ApiGateway::Resource") {
				if props(r)["PathPart"] == "_floor" {
					routes = append(routes, id)
				}
			}
			if env == "local" {
				if len(floors) != 1 || len(routes) != 1 {
					t.Errorf("local: floor functions %v, _floor resources %v; want one each", floors, routes)
				}
				return
			}
			if len(floors) != 0 || len(routes) != 0 {
				t.Errorf("%s has the floor: functions %v, _floor resources %v", env, floors, routes)
			}
		})
	}
}
