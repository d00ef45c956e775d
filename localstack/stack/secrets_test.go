package stack

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"unicode"

	"github.com/sivchari/kumo"
)

// TestProvisionSecret: the template's secret (as the CDK app writes the agent master secret)
// is created in the emulator with a generated value that functions and tools read back by the
// ARN its Ref resolves to, as the stack outputs give it.
func TestProvisionSecret(t *testing.T) {
	srv := kumo.NewServer()
	t.Cleanup(srv.Close)
	ctx := context.Background()
	p := newProvisioner(&template{Resources: map[string]*resource{}}, "capacity-test", srv.URL, slog.New(slog.DiscardHandler))
	name := "capacity/" + strings.ToLower(t.Name()) + "/agent-master"
	props := map[string]any{
		"Name": name,
		"GenerateSecretString": map[string]any{
			"PasswordLength": json.Number("64"), "ExcludePunctuation": true, "IncludeSpace": false,
		},
	}
	phys, err := provisionSecret(ctx, p, "AgentMasterSecret", nil, props)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(phys.ref, "arn:aws:secretsmanager:") {
		t.Fatalf("Ref = %q, want the secret's ARN", phys.ref)
	}
	raw, err := ReadSecret(ctx, srv.URL, phys.ref)
	if err != nil {
		t.Fatal(err)
	}
	v := string(raw)
	if len(v) != 64 || strings.IndexFunc(v, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) }) >= 0 {
		t.Fatalf("generated value %q: want 64 alphanumerics", v)
	}
	// A second stack in the same process finds the secret there and keeps its value.
	again, err := provisionSecret(ctx, p, "AgentMasterSecret", nil, props)
	if err != nil || again.ref != phys.ref {
		t.Fatalf("second provision = %+v, %v", again, err)
	}
}

func TestSecretValue(t *testing.T) {
	n := func(s string) json.Number { return json.Number(s) }
	tests := []struct {
		name    string
		sec     cfnSecret
		check   func(string) bool
		wantErr bool
	}{
		{"literal", cfnSecret{SecretString: "s3cret"}, func(v string) bool { return v == "s3cret" }, false},
		{"default length", cfnSecret{GenerateSecretString: &cfnSecretGenerator{}}, func(v string) bool { return len(v) == 32 }, false},
		{"into a template", cfnSecret{GenerateSecretString: &cfnSecretGenerator{PasswordLength: n("10"), SecretStringTemplate: `{"user":"a"}`, GenerateStringKey: "password"}}, func(v string) bool {
			var m map[string]string
			return json.Unmarshal([]byte(v), &m) == nil && m["user"] == "a" && len(m["password"]) == 10
		}, false},
		{"no value", cfnSecret{}, nil, true},
		{"bad length", cfnSecret{GenerateSecretString: &cfnSecretGenerator{PasswordLength: n("0")}}, nil, true},
	}
	for _, tc := range tests {
		v, err := secretValue(tc.sec)
		if (err != nil) != tc.wantErr || (err == nil && !tc.check(v)) {
			t.Errorf("%s: secretValue = %q, %v", tc.name, v, err)
		}
	}
}
