package stackname

import "testing"

// TestNames pins the names' form: operators, dashboards, log groups and the docs know the
// deployed resources by it, so a change to it must be deliberate.
func TestNames(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{Stack("prod"), "capacity-prod"},
		{Resource("prod", "termination"), "capacity-prod-termination"},
		{Function("local", "terminate-node"), "capacity-local-terminate-node"},
		{Function("dev", "api"), "capacity-dev-api"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}
