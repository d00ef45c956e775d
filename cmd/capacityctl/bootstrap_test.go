package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go/middleware"

	"github.com/openrelay/capacity/shared/auth"
	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// TestBootstrapKey writes the first operator key to the keys table, as AWS answers: plainly,
// throttled beyond the SDK's retries (nothing usable written, no secret shown), and with the
// answer of a write that landed lost (the key is stored and its secret shown).
func TestBootstrapKey(t *testing.T) {
	tests := []struct {
		name   string
		faults []awsfault.Rule
		code   int
		stored bool
		lost   bool // the CLI must have found the key after a lost answer
	}{
		{"plain", nil, 0, true, false},
		{"throttled throughout", []awsfault.Rule{{Operation: "PutItem", Fault: awsfault.Throttling, Rate: 1}}, 1, false, false},
		// Every PutItem answer is lost: the first lands, the SDK's retry meets the item (a failed condition, answered).
		{"answer lost after the write", []awsfault.Rule{{Operation: "PutItem", Fault: awsfault.AmbiguousTimeout, Rate: 1}}, 0, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := dynamotest.New(t)
			outputs := filepath.Join(t.TempDir(), "outputs.json")
			writeFile(t, outputs, `{"capacity-local":{"ApiUrl":"http://127.0.0.1:4566/x/","KeysTableName":"`+env.Store.KeysTable+`"}}`)
			inj := awsfault.New(1, tt.faults...)
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
			code := a.main(context.Background(), []string{"--outputs", outputs, "--output", "json", "keys", "create", "--bootstrap", "--org", "org-platform", "--description", "first"})
			if code != tt.code {
				t.Fatalf("exit %d, want %d: %s", code, tt.code, errOut.String())
			}
			if lost := strings.Contains(errOut.String(), "answer was lost"); lost != tt.lost {
				t.Errorf("lost answer reported %v, want %v (faults injected: %v): %s", lost, tt.lost, inj.Counts(), errOut.String())
			}
			if !tt.stored {
				if out.Len() != 0 {
					t.Errorf("printed %q for a key that was not written", out.String())
				}
				return
			}
			var got struct {
				Key struct {
					KeyID       string   `json:"keyId"`
					Permissions []string `json:"permissions"`
				} `json:"key"`
				Secret string `json:"secret"`
			}
			if err := json.Unmarshal([]byte(out.String()), &got); err != nil {
				t.Fatalf("%v: %s", err, out.String())
			}
			if err := capacity.CheckKeySecret(got.Secret); err != nil {
				t.Errorf("secret %q: %v", got.Secret, err)
			}
			keys := &dynamo.Keys{Client: dynamodb.NewFromConfig(aws.Config{Region: "us-east-1", BaseEndpoint: aws.String(env.URL),
				Credentials: credentials.NewStaticCredentialsProvider("test", "test", "")}), Table: env.Store.KeysTable}
			k, err := keys.LookupKey(context.Background(), auth.Hash(got.Secret))
			if err != nil || k == nil {
				t.Fatalf("the key is not stored: %v", err)
			}
			if k.KeyID != got.Key.KeyID || !k.Operator || k.OrgID != "org-platform" || len(k.Permissions) != 3 {
				t.Errorf("stored %+v", k)
			}
		})
	}
}
