package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
)

const describeOK = `<DescribeStacksResponse xmlns="http://cloudformation.amazonaws.com/doc/2010-05-15/">
  <DescribeStacksResult><Stacks><member>
    <StackName>capacity-dev</StackName><StackStatus>UPDATE_COMPLETE</StackStatus>
    <CreationTime>2026-01-01T00:00:00Z</CreationTime>
    <Outputs>
      <member><OutputKey>ApiUrl</OutputKey><OutputValue>https://abc.execute-api.eu-west-1.amazonaws.com/dev/</OutputValue></member>
      <member><OutputKey>KeysTableName</OutputKey><OutputValue>capacity-dev-keys</OutputValue></member>
    </Outputs>
  </member></Stacks></DescribeStacksResult>
  <ResponseMetadata><RequestId>r1</RequestId></ResponseMetadata>
</DescribeStacksResponse>`

func cfnError(code, msg string) string {
	return `<ErrorResponse xmlns="http://cloudformation.amazonaws.com/doc/2010-05-15/"><Error><Type>Sender</Type><Code>` + code +
		`</Code><Message>` + msg + `</Message></Error><RequestId>r2</RequestId></ErrorResponse>`
}

// TestDescribeStack reads a stack's outputs from CloudFormation as AWS answers: plainly,
// throttled once (the SDK retries), throttled throughout, and for a stack that does not exist.
func TestDescribeStack(t *testing.T) {
	tests := []struct {
		name      string
		throttled int // answers throttled before the real one (-1: all)
		missing   bool
		want      string // ApiUrl; "" = an error
		wantErr   string
	}{
		{"plain", 0, false, "https://abc.execute-api.eu-west-1.amazonaws.com/dev/", ""},
		{"throttled once", 1, false, "https://abc.execute-api.eu-west-1.amazonaws.com/dev/", ""},
		{"throttled throughout", -1, false, "", "Rate exceeded"},
		{"no such stack", 0, true, "", "Stack with id capacity-dev does not exist"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var calls atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				if !strings.Contains(string(body), "Action=DescribeStacks") || !strings.Contains(string(body), "StackName=capacity-dev") {
					t.Errorf("request %s", body)
				}
				n := int(calls.Add(1))
				w.Header().Set("Content-Type", "text/xml")
				switch {
				case tt.throttled < 0 || n <= tt.throttled:
					w.WriteHeader(400)
					_, _ = io.WriteString(w, cfnError("Throttling", "Rate exceeded"))
				case tt.missing:
					w.WriteHeader(400)
					_, _ = io.WriteString(w, cfnError("ValidationError", "Stack with id capacity-dev does not exist"))
				default:
					_, _ = io.WriteString(w, describeOK)
				}
			}))
			defer srv.Close()
			a := &app{stack: "capacity-dev", getenv: func(string) string { return "" }, io: stdio{err: io.Discard}}
			a.awsConfig = func(context.Context) (aws.Config, error) {
				return aws.Config{Region: "eu-west-1", BaseEndpoint: aws.String(srv.URL),
					Credentials: credentials.NewStaticCredentialsProvider("a", "b", ""),
					Retryer: func() aws.Retryer {
						return retry.NewStandard(func(o *retry.StandardOptions) { o.MaxAttempts, o.MaxBackoff = 3, time.Millisecond })
					}}, nil
			}
			if !endpointIs(t, a, tt.want, tt.wantErr) {
				return
			}
			if a.outputs["KeysTableName"] != "capacity-dev-keys" {
				t.Errorf("outputs %v", a.outputs)
			}
		})
	}
}
