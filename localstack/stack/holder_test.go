package stack

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// TestHolderPathPerNetworkNamespace: stacks on the same address in separate network
// namespaces (CI runners sharing /tmp) name separate holder files.
func TestHolderPathPerNetworkNamespace(t *testing.T) {
	tests := []struct {
		name       string
		nsA, nsB   string
		addrA      string
		addrB      string
		sameHolder bool
	}{
		{"same namespace, same address", "4026531840", "4026531840", DefaultAddr, DefaultAddr, true},
		{"other namespace, same address", "4026531840", "4026532999", DefaultAddr, DefaultAddr, false},
		{"same namespace, other port", "4026531840", "4026531840", DefaultAddr, "127.0.0.1:4567", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := holderPathIn(tt.nsA, tt.addrA), holderPathIn(tt.nsB, tt.addrB)
			if (a == b) != tt.sameHolder {
				t.Errorf("holder files %s and %s; want the same: %v", a, b, tt.sameHolder)
			}
		})
	}
	if netNamespace() == "" {
		t.Skip("no /proc/self/ns/net here")
	}
	if holderPath(DefaultAddr) != holderPathIn(netNamespace(), DefaultAddr) {
		t.Error("holderPath is not keyed by this process's network namespace")
	}

	// For real: this test binary started again in a network namespace of its own.
	cmd := exec.Command(os.Args[0], "-test.run=^TestHolderPathChild$")
	cmd.Env = append(os.Environ(), "HOLDER_PATH_CHILD=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	out, err := cmd.Output()
	if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EINVAL) {
		t.Skipf("cannot make a network namespace here: %v", err)
	}
	if err != nil {
		t.Fatalf("child in a new network namespace: %v\n%s", err, out)
	}
	child, _, _ := strings.Cut(string(out), "\n")
	if child == "" || child == holderPath(DefaultAddr) {
		t.Errorf("a stack in another network namespace names holder file %q, as this one: %q", child, holderPath(DefaultAddr))
	}
}

// TestHolderPathChild prints the holder path of DefaultAddr when run by
// TestHolderPathPerNetworkNamespace; otherwise it does nothing.
func TestHolderPathChild(t *testing.T) {
	if os.Getenv("HOLDER_PATH_CHILD") != "1" {
		return
	}
	fmt.Println(holderPath(DefaultAddr))
}
