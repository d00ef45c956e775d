package main

import (
	"testing"

	"github.com/openrelay/capacity/shared/config/envvar"
)

// TestReadSettings: the function reads exactly the variables envvar.Floor declares: an
// undeclared read, or a declared one left unread, would fail it at start.
func TestReadSettings(t *testing.T) {
	e := envvar.New(envvar.Floor, []string{"APP_ENV=local", "LOG_LEVEL=info", "STATE_MACHINE_ARN=arn:sm"})
	if s := readSettings(e); e.Err() != nil || s.stateMachineARN != "arn:sm" {
		t.Fatalf("settings %+v, error %v", s, e.Err())
	}
}
