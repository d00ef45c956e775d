package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/smithy-go/middleware"

	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// TestBootstrapKey creates the first operator key with AWS credentials, through the domain,
// as AWS answers: plainly, throttled beyond the SDK's retries (nothing written, no secret
// shown), with the answer of a write that landed lost (the key is found and its secret
// shown), and run again with the same Idempotency-Key (replayed, the secret not shown again).
// Each time the key has its id pointer and exactly one record on the keys' audit chain.
func TestBootstrapKey(t *testing.T) {
	tests := []struct {
		name   string
		faults []awsfault.Rule
		code   int
		stored bool
		repeat bool // run the same command (same --idempotency-key) a second time
		genKey bool // no --idempotency-key: the one generated is printed before the write
	}{
		{"plain", nil, 0, true, false, false},
		{"throttled throughout", []awsfault.Rule{{Operation: "TransactWriteItems", Fault: awsfault.Throttling, Rate: 1}}, 1, false, false, false},
		{"throttled throughout, the generated key printed", []awsfault.Rule{{Operation: "TransactWriteItems", Fault: awsfault.Throttling, Rate: 1}}, 1, false, false, true},
		// Every transaction's answer is lost: the first lands, the SDK's retry meets its items.
		{"answer lost after the write", []awsfault.Rule{{Operation: "TransactWriteItems", Fault: awsfault.AmbiguousTimeout, Rate: 1}}, 0, true, false, false},
		{"run again with the same idempotency key", nil, 0, true, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := dynamotest.New(t)
			outputs := filepath.Join(t.TempDir(), "outputs.json")
			writeFile(t, outputs, `{"capacity-local":{"ApiUrl":"http://127.0.0.1:4566/x/","StateTableName":"`+env.Store.Table+
				`","AuditTableName":"`+env.Store.AuditTable+`","KeysTableName":"`+env.Store.KeysTable+`"}}`)
			inj := awsfault.New(1, tt.faults...)
			run := func() (int, string, string) {
				var out, errOut strings.Builder
				a := &app{io: stdio{in: strings.NewReader(""), out: &out, err: &errOut}, getenv: func(string) string { return "" }}
				a.awsConfig = func(context.Context) (aws.Config, error) {
					return aws.Config{
						Region: "us-east-1", BaseEndpoint: aws.String(env.URL),
						Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
						APIOptions:  []func(*middleware.Stack) error{inj.APIOption},
						Retryer: func() aws.Retryer {
							return retry.NewStandard(func(o *retry.StandardOptions) { o.MaxAttempts, o.MaxBackoff = 3, time.Millisecond })
						},
					}, nil
				}
				args := []string{"--outputs", outputs, "--output", "json", "keys", "create", "--bootstrap",
					"--org", "org-platform", "--description", "first"}
				if !tt.genKey {
					args = append(args, "--idempotency-key", "first-operator-key")
				}
				code := a.main(context.Background(), args)
				return code, out.String(), errOut.String()
			}
			code, out, errOut := run()
			if code != tt.code {
				t.Fatalf("exit %d, want %d: %s", code, tt.code, errOut)
			}
			// The key is printed before the write, so a failed run can be repeated with it.
			wantKey := "--idempotency-key first-operator-key"
			if tt.genKey {
				wantKey = "--idempotency-key bootstrap-"
			}
			if !strings.Contains(errOut, wantKey) {
				t.Errorf("stderr %q does not name the Idempotency-Key to rerun with (%s)", errOut, wantKey)
			}
			for _, f := range tt.faults {
				if inj.Count(f.Fault) == 0 {
					t.Errorf("%s was not injected", f.Fault)
				}
			}
			if !tt.stored {
				// Under --output json a failure prints its problem document, and nothing else.
				var p cliProblem
				if err := json.Unmarshal([]byte(out), &p); err != nil || p.Code != "failed" || p.ExitCode != tt.code || strings.Contains(out, "secret") {
					t.Errorf("printed %q for a key that was not written; want only the problem (%v)", out, err)
				}
				if n := len(env.Items(t, env.Store.KeysTable)) + len(env.Items(t, env.Store.AuditTable)); n != 0 {
					t.Errorf("%d items written", n)
				}
				return
			}
			type answer struct {
				Key struct {
					KeyID       string   `json:"keyId"`
					Permissions []string `json:"permissions"`
					CreatedBy   string   `json:"createdBy"`
				} `json:"key"`
				Secret      string `json:"secret"`
				SecretShown bool   `json:"secretShown"`
			}
			var got answer
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			if err := capacity.CheckKeySecret(got.Secret); err != nil {
				t.Errorf("secret %q: %v", got.Secret, err)
			}
			if tt.repeat {
				code, out, errOut := run()
				var again answer
				if code != 0 || json.Unmarshal([]byte(out), &again) != nil {
					t.Fatalf("second run: exit %d: %s %s", code, out, errOut)
				}
				if again.Secret != "" || !again.SecretShown || again.Key.KeyID != got.Key.KeyID {
					t.Errorf("second run answered %s; want the same key, replayed without its secret", out)
				}
			}
			ctx := context.Background()
			k, err := env.Store.Keys().LookupKey(ctx, capacity.HashKeySecret(got.Secret))
			if err != nil || k == nil {
				t.Fatalf("the key is not stored: %v", err)
			}
			if k.KeyID != got.Key.KeyID || !k.Operator || k.OrgID != "org-platform" || !slices.Equal(k.Permissions, capacity.AllPermissions) ||
				k.CreatedByKeyID != capacity.BootstrapKeyID || got.Key.CreatedBy != capacity.BootstrapKeyID {
				t.Errorf("stored %+v, answered %+v", k, got.Key)
			}
			// Found by id (its pointer), and the only key.
			if byID, err := env.Store.GetKey(ctx, k.KeyID); err != nil || byID.Hash != k.Hash {
				t.Errorf("GetKey(%s) = %+v, %v", k.KeyID, byID, err)
			}
			svc := &capacity.Service{Store: env.Store, Keys: env.Store}
			op := capacity.Principal{KeyID: k.KeyID, OrgID: k.OrgID, Operator: true, Permissions: k.Permissions}
			if page, err := svc.ListKeys(ctx, op, capacity.PageRequest{}); err != nil || len(page.Keys) != 1 {
				t.Errorf("keys: %+v, %v; want the one", page, err)
			}
			// One record on the keys' chain, written directly by the bootstrap principal (and,
			// run again, the replay's).
			chain, err := svc.ListKeyAudit(ctx, op, capacity.PageRequest{})
			if err != nil {
				t.Fatal(err)
			}
			records := 1
			if tt.repeat {
				records = 2
			}
			if rep := capacity.VerifyAuditChain(chain.Head, chain.Records); !rep.OK || len(chain.Records) != records {
				t.Fatalf("key chain %+v: %+v", chain.Records, rep)
			}
			if tt.repeat && (chain.Records[1].Outcome != capacity.OutcomeReplayed || chain.Records[1].Via != capacity.ViaDirect) {
				t.Errorf("second record %+v, want the replay", chain.Records[1])
			}
			rec := chain.Records[0]
			if rec.Action != capacity.ActionKeyCreate || rec.Via != capacity.ViaDirect || rec.ActorKeyID != capacity.BootstrapKeyID ||
				rec.CallerOrgID != "org-platform" || rec.TargetKeyID != k.KeyID || rec.Seq != 1 {
				t.Errorf("audit record %+v", rec)
			}
			// Neither the secret nor anything derived from it beyond the key's hash is stored.
			for _, table := range []string{env.Store.KeysTable, env.Store.AuditTable} {
				for _, it := range env.Items(t, table) {
					var m map[string]any
					_ = attributevalue.UnmarshalMap(it, &m)
					if b, _ := json.Marshal(m); strings.Contains(string(b), got.Secret) {
						t.Errorf("%s holds the secret", table)
					}
				}
			}
		})
	}
}
