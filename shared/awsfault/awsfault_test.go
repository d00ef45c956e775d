package awsfault_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	sfntypes "github.com/aws/aws-sdk-go-v2/service/sfn/types"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"
	"github.com/sivchari/kumo"

	"github.com/openrelay/capacity/shared/awsfault"
)

// tableName is set per test: the emulator keeps tables process-wide, so each test makes its own.
var tableName string

var tableSeq atomic.Int64

// retryer is the SDK's standard retryer as functions configure it, with millisecond backoff
// so the tests do not sleep for seconds.
func retryer(attempts int) func() aws.Retryer {
	return func() aws.Retryer {
		return retry.NewStandard(func(o *retry.StandardOptions) {
			o.MaxAttempts = attempts
			o.MaxBackoff = time.Millisecond
		})
	}
}

func emulator(t *testing.T) string {
	t.Helper()
	srv := kumo.NewServer()
	t.Cleanup(srv.Close)
	return srv.URL
}

func ddbClient(t *testing.T, url string, inj *awsfault.Injector, attempts int) *dynamodb.Client {
	t.Helper()
	opts := dynamodb.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(url), Retryer: retryer(attempts)(),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
	}
	if inj != nil {
		opts.APIOptions = []func(*middleware.Stack) error{inj.APIOption}
	}
	return dynamodb.New(opts)
}

// table creates the test table through a client without faults.
func table(t *testing.T, url string) *dynamodb.Client {
	t.Helper()
	tableName = fmt.Sprintf("t%d", tableSeq.Add(1))
	c := ddbClient(t, url, nil, 1)
	_, err := c.CreateTable(context.Background(), &dynamodb.CreateTableInput{
		TableName:   aws.String(tableName),
		BillingMode: types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String("PK"), AttributeType: types.ScalarAttributeTypeS},
		},
		KeySchema: []types.KeySchemaElement{{AttributeName: aws.String("PK"), KeyType: types.KeyTypeHash}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func item(pk string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{"PK": &types.AttributeValueMemberS{Value: pk}}
}

func putNew(pk string) *dynamodb.PutItemInput {
	return &dynamodb.PutItemInput{TableName: aws.String(tableName), Item: item(pk), ConditionExpression: aws.String("attribute_not_exists(PK)")}
}

func exists(t *testing.T, c *dynamodb.Client, pk string) bool {
	t.Helper()
	out, err := c.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: aws.String(tableName), Key: item(pk), ConsistentRead: aws.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	return out.Item != nil
}

func transact(pks ...string) *dynamodb.TransactWriteItemsInput {
	in := &dynamodb.TransactWriteItemsInput{}
	for _, pk := range pks {
		in.TransactItems = append(in.TransactItems, types.TransactWriteItem{Put: &types.Put{TableName: aws.String(tableName), Item: item(pk)}})
	}
	return in
}

func reasonCodes(e *types.TransactionCanceledException) []string {
	var out []string
	for _, r := range e.CancellationReasons {
		out = append(out, aws.ToString(r.Code))
	}
	return out
}

// TestDynamoDBFaultsAsAWSSendsThem checks each DynamoDB fault arrives as the SDK's real error
// type, is retried or not as the standard retryer does with AWS's, and applies nothing.
func TestDynamoDBFaultsAsAWSSendsThem(t *testing.T) {
	url := emulator(t)
	plain := table(t, url)
	ctx := context.Background()

	tests := []struct {
		name    string
		rule    awsfault.Rule
		call    func(c *dynamodb.Client, pk string) error
		check   func(t *testing.T, err error)
		retried bool // the standard retryer retries it: every attempt is injected
	}{
		{
			name: "transaction conflict cancels the transaction",
			rule: awsfault.Rule{Operation: "TransactWriteItems", Fault: awsfault.TransactionConflict, Rate: 1},
			call: func(c *dynamodb.Client, pk string) error {
				_, err := c.TransactWriteItems(ctx, transact(pk, pk+"-b", pk+"-c"))
				return err
			},
			check: func(t *testing.T, err error) {
				var e *types.TransactionCanceledException
				if !errors.As(err, &e) {
					t.Fatalf("got %T %v, want TransactionCanceledException", err, err)
				}
				codes, conflicts := reasonCodes(e), 0
				if len(codes) != 3 {
					t.Fatalf("reasons %v, want one per action", codes)
				}
				for _, c := range codes {
					switch c {
					case "TransactionConflict":
						conflicts++
					case "None":
					default:
						t.Errorf("reason %q, want TransactionConflict or None", c)
					}
				}
				if conflicts != 1 {
					t.Errorf("reasons %v, want exactly one TransactionConflict", codes)
				}
			},
		},
		{
			name: "transaction conflict on a single-item write",
			rule: awsfault.Rule{Operation: "PutItem", Fault: awsfault.TransactionConflict, Rate: 1},
			call: func(c *dynamodb.Client, pk string) error { _, err := c.PutItem(ctx, putNew(pk)); return err },
			check: func(t *testing.T, err error) {
				var e *types.TransactionConflictException
				if !errors.As(err, &e) {
					t.Fatalf("got %T %v, want TransactionConflictException", err, err)
				}
			},
		},
		{
			name: "provisioned throughput exceeded",
			rule: awsfault.Rule{Operation: "PutItem", Fault: awsfault.ProvisionedThroughputExceeded, Rate: 1},
			call: func(c *dynamodb.Client, pk string) error { _, err := c.PutItem(ctx, putNew(pk)); return err },
			check: func(t *testing.T, err error) {
				var e *types.ProvisionedThroughputExceededException
				if !errors.As(err, &e) {
					t.Fatalf("got %T %v, want ProvisionedThroughputExceededException", err, err)
				}
			},
			retried: true,
		},
		{
			name: "throttling",
			rule: awsfault.Rule{Operation: "UpdateItem", Fault: awsfault.Throttling, Rate: 1},
			call: func(c *dynamodb.Client, pk string) error {
				_, err := c.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(tableName), Key: item(pk),
					UpdateExpression: aws.String("SET A = :a"), ExpressionAttributeValues: map[string]types.AttributeValue{":a": &types.AttributeValueMemberN{Value: "1"}}})
				return err
			},
			check: func(t *testing.T, err error) {
				var api smithy.APIError
				if !errors.As(err, &api) || api.ErrorCode() != "ThrottlingException" {
					t.Fatalf("got %T %v, want ThrottlingException", err, err)
				}
			},
			retried: true,
		},
		{
			name: "access denied on a transaction",
			rule: awsfault.Rule{Operation: "TransactWriteItems", Fault: awsfault.AccessDenied, Rate: 1},
			call: func(c *dynamodb.Client, pk string) error {
				_, err := c.TransactWriteItems(ctx, transact(pk, pk+"-b"))
				return err
			},
			check: func(t *testing.T, err error) { checkAccessDenied(t, err, "dynamodb:TransactWriteItems") },
		},
		{
			name: "access denied on a single-item write",
			rule: awsfault.Rule{Fault: awsfault.AccessDenied, Rate: 1},
			call: func(c *dynamodb.Client, pk string) error {
				_, err := c.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(tableName), Key: item(pk),
					UpdateExpression: aws.String("SET A = :a"), ExpressionAttributeValues: map[string]types.AttributeValue{":a": &types.AttributeValueMemberN{Value: "1"}}})
				return err
			},
			check: func(t *testing.T, err error) { checkAccessDenied(t, err, "dynamodb:UpdateItem") },
		},
	}
	for n, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			inj := awsfault.New(int64(n), tc.rule)
			c := ddbClient(t, url, inj, 3)
			pk := "k" + string(rune('a'+n))
			err := tc.call(c, pk)
			tc.check(t, err)
			want := 1
			var maxAttempts *retry.MaxAttemptsError
			if !tc.retried && errors.As(err, &maxAttempts) {
				t.Errorf("error %v was retried; AWS's answer is not", err)
			}
			if tc.retried {
				want = 3
				var max *retry.MaxAttemptsError
				if !errors.As(err, &max) {
					t.Errorf("error %v did not come through the retryer's attempts", err)
				}
			}
			if got := inj.Count(tc.rule.Fault); got != want {
				t.Errorf("injected %d times, want %d (one per attempt the retryer made)", got, want)
			}
			if exists(t, plain, pk) {
				t.Errorf("item %s was written; a fault must apply nothing", pk)
			}
		})
	}
}

// checkAccessDenied: IAM's refusal arrives as an API error with code AccessDeniedException,
// HTTP 400, naming the action refused.
func checkAccessDenied(t *testing.T, err error, action string) {
	t.Helper()
	var api smithy.APIError
	if !errors.As(err, &api) || api.ErrorCode() != "AccessDeniedException" {
		t.Fatalf("got %T %v, want AccessDeniedException", err, err)
	}
	if api.ErrorFault() != smithy.FaultUnknown && api.ErrorFault() != smithy.FaultClient {
		t.Errorf("fault %v, want a client fault", api.ErrorFault())
	}
	if !strings.Contains(api.ErrorMessage(), "not authorized to perform: "+action) {
		t.Errorf("message %q does not name %s", api.ErrorMessage(), action)
	}
	var status interface{ HTTPStatusCode() int }
	if !errors.As(err, &status) || status.HTTPStatusCode() != 400 {
		t.Errorf("%v: want HTTP status 400", err)
	}
}

// TestAccessDeniedOnSecretsManager: a JSON 1.1 service gets the same refusal, once (not
// retried), and the secret's value is not answered.
func TestAccessDeniedOnSecretsManager(t *testing.T) {
	url := emulator(t)
	ctx := context.Background()
	plain := secretsmanager.New(secretsmanager.Options{Region: "us-east-1", BaseEndpoint: aws.String(url),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", "")})
	if _, err := plain.CreateSecret(ctx, &secretsmanager.CreateSecretInput{Name: aws.String("denied"), SecretString: aws.String("s3cret")}); err != nil {
		t.Fatal(err)
	}
	inj := awsfault.New(1, awsfault.Rule{Operation: "GetSecretValue", Fault: awsfault.AccessDenied, Rate: 1})
	c := secretsmanager.New(secretsmanager.Options{Region: "us-east-1", BaseEndpoint: aws.String(url), Retryer: retryer(3)(),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
		APIOptions:  []func(*middleware.Stack) error{inj.APIOption}})
	out, err := c.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: aws.String("denied")})
	checkAccessDenied(t, err, "secretsmanager:GetSecretValue")
	if out != nil {
		t.Errorf("answered %+v with the refusal", out)
	}
	if got := inj.Count(awsfault.AccessDenied); got != 1 {
		t.Errorf("injected %d times, want 1 (the SDK does not retry a refusal)", got)
	}
	// Other operations of the client are allowed.
	if _, err := c.DescribeSecret(ctx, &secretsmanager.DescribeSecretInput{SecretId: aws.String("denied")}); err != nil {
		t.Errorf("DescribeSecret: %v, want no fault", err)
	}
}

// TestThrottledTransactionsTakeBothForms: AWS throttles a transaction either with the
// exception (retried by the SDK) or by cancelling it with a throttling reason (not retried).
func TestThrottledTransactionsTakeBothForms(t *testing.T) {
	url := emulator(t)
	plain := table(t, url)
	inj := awsfault.New(7, awsfault.Rule{Operation: "TransactWriteItems", Fault: awsfault.Throttling, Rate: 1})
	c := ddbClient(t, url, inj, 1)
	var exception, cancelled int
	for k := range 20 {
		_, err := c.TransactWriteItems(context.Background(), transact("x"+string(rune('a'+k)), "y"+string(rune('a'+k))))
		var ce *types.TransactionCanceledException
		var te *types.ThrottlingException
		switch {
		case errors.As(err, &ce):
			codes := reasonCodes(ce)
			if !(codes[0] == "ThrottlingError" && codes[1] == "None" || codes[0] == "None" && codes[1] == "ThrottlingError") {
				t.Fatalf("reasons %v, want one ThrottlingError", codes)
			}
			cancelled++
		case errors.As(err, &te):
			exception++
		default:
			t.Fatalf("got %T %v", err, err)
		}
	}
	if exception == 0 || cancelled == 0 {
		t.Errorf("exception %d, cancelled %d: want both forms", exception, cancelled)
	}
	if exists(t, plain, "xa") {
		t.Error("a throttled transaction was applied")
	}
}

// TestThrottlingIsRetriedToSuccess: at a partial rate the SDK's retries hide most throttles.
func TestThrottlingIsRetriedToSuccess(t *testing.T) {
	url := emulator(t)
	plain := table(t, url)
	inj := awsfault.New(1, awsfault.Rule{Fault: awsfault.Throttling, Rate: 0.3})
	c := ddbClient(t, url, inj, 5)
	for k := range 20 {
		if _, err := c.PutItem(context.Background(), putNew("p"+string(rune('a'+k)))); err != nil {
			t.Fatalf("put %d: %v", k, err)
		}
	}
	if inj.Count(awsfault.Throttling) == 0 {
		t.Fatal("nothing injected at rate 0.3 over 20 calls")
	}
	if !exists(t, plain, "pt") {
		t.Error("last put not applied")
	}
}

// TestAmbiguousTimeoutAppliesTheWrite: the caller sees a timeout although the write landed;
// the SDK retries it, and the retry meets the first attempt's write.
func TestAmbiguousTimeoutAppliesTheWrite(t *testing.T) {
	url := emulator(t)
	plain := table(t, url)
	ctx := context.Background()

	t.Run("single attempt: a timeout, and the write landed", func(t *testing.T) {
		inj := awsfault.New(1, awsfault.Rule{Operation: "PutItem", Fault: awsfault.AmbiguousTimeout, Rate: 1})
		_, err := ddbClient(t, url, inj, 1).PutItem(ctx, putNew("amb-1"))
		var timeout interface{ Timeout() bool }
		if !errors.As(err, &timeout) || !timeout.Timeout() {
			t.Fatalf("got %T %v, want a timeout", err, err)
		}
		var netErr net.Error
		if !errors.As(err, &netErr) {
			t.Errorf("%v is not a net.Error as net/http's timeouts are", err)
		}
		if !exists(t, plain, "amb-1") {
			t.Error("the write was not applied")
		}
	})
	t.Run("retried: the retry meets the applied write", func(t *testing.T) {
		inj := awsfault.New(1, awsfault.Rule{Operation: "PutItem", Fault: awsfault.AmbiguousTimeout, Rate: 1})
		_, err := ddbClient(t, url, inj, 3).PutItem(ctx, putNew("amb-2"))
		if got := inj.Count(awsfault.AmbiguousTimeout); got != 1 {
			t.Errorf("counted %d timeouts, want 1: the retry failed on its own", got)
		}
		var ccf *types.ConditionalCheckFailedException
		if !errors.As(err, &ccf) {
			t.Fatalf("got %T %v, want the retry's ConditionalCheckFailedException", err, err)
		}
		if !exists(t, plain, "amb-2") {
			t.Error("the write was not applied")
		}
	})
}

// TestServerErrorAppliesTheWrite: a write answered with a 500 was applied all the same; the
// caller gets DynamoDB's InternalServerError (HTTP 500), the SDK retries it, and the retry
// meets the first attempt's write.
func TestServerErrorAppliesTheWrite(t *testing.T) {
	url := emulator(t)
	plain := table(t, url)
	ctx := context.Background()
	tests := []struct {
		op    string
		write func(c *dynamodb.Client, pk string) error
		// retryFailed: the error the retry gets from the state the first attempt left.
		retryFailed func(err error) bool
	}{
		{"PutItem", func(c *dynamodb.Client, pk string) error { _, err := c.PutItem(ctx, putNew(pk)); return err },
			func(err error) bool { var e *types.ConditionalCheckFailedException; return errors.As(err, &e) }},
		{"UpdateItem", func(c *dynamodb.Client, pk string) error {
			_, err := c.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(tableName), Key: item(pk),
				UpdateExpression: aws.String("SET A = :a"), ConditionExpression: aws.String("attribute_not_exists(PK)"),
				ExpressionAttributeValues: map[string]types.AttributeValue{":a": &types.AttributeValueMemberS{Value: "x"}}})
			return err
		}, func(err error) bool { var e *types.ConditionalCheckFailedException; return errors.As(err, &e) }},
		{"TransactWriteItems", func(c *dynamodb.Client, pk string) error {
			in := transact(pk)
			in.TransactItems[0].Put.ConditionExpression = aws.String("attribute_not_exists(PK)")
			_, err := c.TransactWriteItems(ctx, in)
			return err
		}, func(err error) bool {
			var e *types.TransactionCanceledException
			return errors.As(err, &e) && strings.Join(reasonCodes(e), ",") == "ConditionalCheckFailed"
		}},
	}
	for _, tt := range tests {
		t.Run(tt.op, func(t *testing.T) {
			inj := awsfault.New(1, awsfault.Rule{Operation: tt.op, Fault: awsfault.InternalServerError, Rate: 1})
			pk := "ise-" + tt.op
			err := tt.write(ddbClient(t, url, inj, 1), pk)
			var ise *types.InternalServerError
			var status interface{ HTTPStatusCode() int }
			if !errors.As(err, &ise) || !errors.As(err, &status) || status.HTTPStatusCode() != 500 {
				t.Fatalf("got %T %v, want InternalServerError with HTTP 500", err, err)
			}
			if !exists(t, plain, pk) {
				t.Error("the write was not applied")
			}
			// Retried by the SDK: the retry meets the write the first attempt applied.
			inj = awsfault.New(1, awsfault.Rule{Operation: tt.op, Fault: awsfault.InternalServerError, Rate: 1, Max: 1})
			err = tt.write(ddbClient(t, url, inj, 3), pk+"-retried")
			if !tt.retryFailed(err) || inj.Count(awsfault.InternalServerError) != 1 {
				t.Fatalf("got %T %v after %d faults, want the retry's condition failure after 1", err, err, inj.Count(awsfault.InternalServerError))
			}
			if !exists(t, plain, pk+"-retried") {
				t.Error("the write was not applied")
			}
		})
	}
}

func sfnClient(url string, inj *awsfault.Injector, attempts int) *sfn.Client {
	return sfn.New(sfn.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(url), Retryer: retryer(attempts)(),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
		APIOptions:  []func(*middleware.Stack) error{inj.APIOption},
	})
}

// TestStartExecutionFaults: a closed execution's name is refused for good and described as
// failed; StartExecution throttling is retried.
func TestStartExecutionFaults(t *testing.T) {
	url := emulator(t)
	ctx := context.Background()
	sm := "arn:aws:states:us-east-1:000000000000:stateMachine:terminate"

	t.Run("execution already exists", func(t *testing.T) {
		inj := awsfault.New(1, awsfault.Rule{Operation: "StartExecution", Fault: awsfault.ExecutionAlreadyExists, Rate: 1})
		c := sfnClient(url, inj, 3)
		for range 2 {
			_, err := c.StartExecution(ctx, &sfn.StartExecutionInput{StateMachineArn: aws.String(sm), Name: aws.String("rcl_1"), Input: aws.String(`{}`)})
			var e *sfntypes.ExecutionAlreadyExists
			if !errors.As(err, &e) {
				t.Fatalf("got %T %v, want ExecutionAlreadyExists", err, err)
			}
		}
		if got := inj.Count(awsfault.ExecutionAlreadyExists); got != 1 {
			t.Errorf("injected %d, want 1 (not retried; the second start meets the closed name)", got)
		}
		out, err := c.DescribeExecution(ctx, &sfn.DescribeExecutionInput{ExecutionArn: aws.String("arn:aws:states:us-east-1:000000000000:execution:terminate:rcl_1")})
		if err != nil {
			t.Fatal(err)
		}
		if out.Status != sfntypes.ExecutionStatusFailed || out.StopDate == nil {
			t.Errorf("status %s stop %v, want a FAILED, stopped run", out.Status, out.StopDate)
		}
	})
	t.Run("start throttling is retried", func(t *testing.T) {
		inj := awsfault.New(1, awsfault.Rule{Fault: awsfault.StartThrottling, Rate: 1})
		_, err := sfnClient(url, inj, 3).StartExecution(ctx, &sfn.StartExecutionInput{StateMachineArn: aws.String(sm), Name: aws.String("rcl_2")})
		var api smithy.APIError
		if !errors.As(err, &api) || api.ErrorCode() != "ThrottlingException" {
			t.Fatalf("got %T %v, want ThrottlingException", err, err)
		}
		if got := inj.Count(awsfault.StartThrottling); got != 3 {
			t.Errorf("injected %d, want 3 (one per attempt)", got)
		}
	})
	t.Run("execution limit exceeded fails the start", func(t *testing.T) {
		inj := awsfault.New(1, awsfault.Rule{Operation: "StartExecution", Fault: awsfault.ExecutionLimitExceeded, Rate: 1, Max: 1})
		var logged bytes.Buffer
		inj.Log = slog.New(slog.NewTextHandler(&logged, nil))
		c := sfnClient(url, inj, 3)
		_, err := c.StartExecution(ctx, &sfn.StartExecutionInput{StateMachineArn: aws.String(sm), Name: aws.String("rcl_3"), Input: aws.String(`{}`)})
		var e *sfntypes.ExecutionLimitExceeded
		if !errors.As(err, &e) {
			t.Fatalf("got %T %v, want ExecutionLimitExceeded", err, err)
		}
		if got := inj.Count(awsfault.ExecutionLimitExceeded); got != 1 {
			t.Errorf("injected %d, want 1 (not retried by the SDK)", got)
		}
		if n := strings.Count(logged.String(), `msg="awsfault injected" fault=ExecutionLimitExceeded operation=StartExecution`); n != 1 {
			t.Errorf("logged %d lines for the fault, want 1: %s", n, logged.String())
		}
	})
}

// TestRulesMatchOperationsAndFaultsTheyFit: a rule touches only its operation, and a fault
// only the operations AWS returns it for.
func TestRulesMatchOperationsAndFaultsTheyFit(t *testing.T) {
	url := emulator(t)
	table(t, url)
	ctx := context.Background()
	inj := awsfault.New(1,
		awsfault.Rule{Operation: "UpdateItem", Fault: awsfault.Throttling, Rate: 1},
		awsfault.Rule{Fault: awsfault.TransactionConflict, Rate: 1},                 // not for reads
		awsfault.Rule{Fault: awsfault.InternalServerError, Rate: 1},                 // writes only
		awsfault.Rule{Fault: awsfault.ExecutionAlreadyExists, Rate: 1},              // not for DynamoDB
		awsfault.Rule{Operation: "Query", Fault: awsfault.StartThrottling, Rate: 1}, // StartExecution only
	)
	c := ddbClient(t, url, inj, 1)
	if _, err := c.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(tableName), Key: item("r")}); err != nil {
		t.Errorf("GetItem: %v, want no fault", err)
	}
	if _, err := c.Query(ctx, &dynamodb.QueryInput{TableName: aws.String(tableName), KeyConditionExpression: aws.String("PK = :p"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":p": &types.AttributeValueMemberS{Value: "r"}}}); err != nil {
		t.Errorf("Query: %v, want no fault", err)
	}
	if total := len(inj.Counts()); total != 0 {
		t.Errorf("injected %v, want nothing", inj.Counts())
	}
}

// TestSameSeedSameFaults: a seed replays the same faults, so a failing run can be repeated.
func TestSameSeedSameFaults(t *testing.T) {
	url := emulator(t)
	table(t, url)
	run := func() []bool {
		inj := awsfault.New(42, awsfault.Rule{Operation: "PutItem", Fault: awsfault.TransactionConflict, Rate: 0.5})
		c := ddbClient(t, url, inj, 1)
		var got []bool
		for range 16 {
			_, err := c.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: aws.String(tableName), Item: item("s")})
			got = append(got, err != nil)
		}
		return got
	}
	a, b := run(), run()
	for k := range a {
		if a[k] != b[k] {
			t.Fatalf("seed 42 gave %v then %v", a, b)
		}
	}
}

func TestParse(t *testing.T) {
	tests := []struct {
		spec    string
		want    []awsfault.Rule
		wantErr bool
	}{
		{spec: "TransactWriteItems:TransactionConflict=0.1,*:Throttling=0.1", want: []awsfault.Rule{
			{Operation: "TransactWriteItems", Fault: awsfault.TransactionConflict, Rate: 0.1},
			{Fault: awsfault.Throttling, Rate: 0.1},
		}},
		{spec: " AmbiguousTimeout=1 , StartExecution:ExecutionAlreadyExists=0", want: []awsfault.Rule{
			{Fault: awsfault.AmbiguousTimeout, Rate: 1},
			{Operation: "StartExecution", Fault: awsfault.ExecutionAlreadyExists, Rate: 0},
		}},
		{spec: "GetSecretValue:AccessDenied=1", want: []awsfault.Rule{
			{Operation: "GetSecretValue", Fault: awsfault.AccessDenied, Rate: 1},
		}},
		{spec: "", wantErr: true},
		{spec: "Throttling", wantErr: true},
		{spec: "Throttling=1.5", wantErr: true},
		{spec: "Throttling=-0.1", wantErr: true},
		{spec: "Throttling=abc", wantErr: true},
		{spec: "PutItem:throttling=0.1", wantErr: true}, // names are exact
		{spec: "PutItem:Boom=0.1", wantErr: true},
	}
	for _, tc := range tests {
		got, err := awsfault.Parse(tc.spec)
		if (err != nil) != tc.wantErr {
			t.Errorf("Parse(%q) error %v, want error %v", tc.spec, err, tc.wantErr)
			continue
		}
		if len(got) != len(tc.want) {
			t.Errorf("Parse(%q) = %v, want %v", tc.spec, got, tc.want)
			continue
		}
		for k := range got {
			if got[k] != tc.want[k] {
				t.Errorf("Parse(%q)[%d] = %v, want %v", tc.spec, k, got[k], tc.want[k])
			}
		}
	}
}

// TestMaxBoundsARule: a rule with Max faults exactly the first Max attempts it matches, and
// then lets every attempt through.
func TestMaxBoundsARule(t *testing.T) {
	url := emulator(t)
	table(t, url)
	tests := []struct {
		name string
		max  int
		want []bool // attempt k failed
	}{
		{"max 3", 3, []bool{true, true, true, false, false, false}},
		{"no max", 0, []bool{true, true, true, true, true, true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inj := awsfault.New(1, awsfault.Rule{Operation: "PutItem", Fault: awsfault.TransactionConflict, Rate: 1, Max: tt.max})
			c := ddbClient(t, url, inj, 1)
			var got []bool
			for range tt.want {
				_, err := c.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: aws.String(tableName), Item: item("m")})
				got = append(got, err != nil)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("attempts failed %v, want %v", got, tt.want)
			}
		})
	}
}
