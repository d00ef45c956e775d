package stack

import (
	"github.com/openrelay/capacity/localstack/quota"

	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/apigateway"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/kms"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/scheduler"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
)

// provisioner creates the template's resources in kumo, in dependency order.
type provisioner struct {
	t         *template
	stackName string
	res       *resolver
	log       *slog.Logger

	dynamodb       *dynamodb.Client
	lambda         *lambda.Client
	apigateway     *apigateway.Client
	sfn            *sfn.Client
	eventbridge    *eventbridge.Client
	secretsmanager *secretsmanager.Client
	sqs            *sqs.Client
	scheduler      *scheduler.Client
	kms            *kms.Client

	functions []functionSpec    // Lambda functions whose code is in the repo
	mappings  []mappingSpec     // SQS event source mappings the runner polls
	queueURLs map[string]string // queue ARN -> URL
	schedules bool              // the template has a schedule group: the runner fires its schedules
	restAPIs  map[string]string // RestApi id -> its stable id (stableAPIID), for Outputs and the proxy
	quotaRes  quota.Resources   // what the quota model needs of the template
	skipped   map[string]int    // resource type -> count, skipped on purpose
	unknown   map[string]int    // resource type -> count, not supported
}

// functionSpec is a Lambda function that the runner backs with a host bootstrap.
type functionSpec struct {
	name    string // Lambda function name
	code    string // capacity:function metadata: ./functions/<code>
	arn     string
	handler string
	memory  int32
	timeout int32
	env     map[string]string
}

// provisionFunc creates one resource from its resolved properties.
type provisionFunc func(ctx context.Context, p *provisioner, id string, r *resource, props map[string]any) (*physical, error)

var provisioners = map[string]provisionFunc{
	"AWS::DynamoDB::Table":             provisionTable,
	"AWS::DynamoDB::GlobalTable":       provisionTable,
	"AWS::Lambda::Function":            provisionFunction,
	"AWS::ApiGateway::RestApi":         provisionRestAPI,
	"AWS::ApiGateway::Resource":        provisionAPIResource,
	"AWS::ApiGateway::Method":          provisionMethod,
	"AWS::ApiGateway::Deployment":      provisionDeployment,
	"AWS::ApiGateway::Stage":           provisionStage,
	"AWS::StepFunctions::StateMachine": provisionStateMachine,
	"AWS::Events::EventBus":            provisionEventBus,
	"AWS::Events::Rule":                provisionRule,
	"AWS::SecretsManager::Secret":      provisionSecret,
	"AWS::SQS::Queue":                  provisionQueue,
	"AWS::SQS::QueuePolicy":            provisionQueuePolicy,
	"AWS::Lambda::EventSourceMapping":  provisionEventSourceMapping,
	"AWS::Scheduler::ScheduleGroup":    provisionScheduleGroup,
	"AWS::KMS::Key":                    provisionKMSKey,
}

// provisionKMSKey creates a symmetric key in the emulator's KMS. Ref is its key id, Arn its
// ARN. Its policy is not applied (the emulator enforces none); nor is the encryption context,
// which shared/kmsseal therefore also checks itself.
func provisionKMSKey(ctx context.Context, p *provisioner, _ string, _ *resource, props map[string]any) (*physical, error) {
	var k struct{ Description string }
	if err := decodeProps(props, &k); err != nil {
		return nil, err
	}
	out, err := p.kms.CreateKey(ctx, &kms.CreateKeyInput{Description: optString(k.Description)})
	if err != nil {
		return nil, fmt.Errorf("create kms key: %w", err)
	}
	id, arn := aws.ToString(out.KeyMetadata.KeyId), aws.ToString(out.KeyMetadata.Arn)
	return &physical{ref: id, attrs: map[string]any{"Arn": arn, "KeyId": id}}, nil
}

// skippedType reports resource types that nothing local needs: permissions (kumo does not
// enforce IAM or resource policies, a bus's included), log groups (function output goes to files), CDK's
// bookkeeping, and alarming (alarms, their topic, the dashboard, API Gateway's account logging
// role): nothing local notifies or graphs. KMS keys are created (the node agents' keys are
// sealed under one), without their policies and aliases.
func skippedType(typ string) bool {
	switch typ {
	case "AWS::Lambda::Permission", "AWS::Logs::LogGroup", "AWS::CDK::Metadata", "AWS::ApiGateway::Account",
		"AWS::SNS::Topic", "AWS::SNS::Subscription", "AWS::SNS::TopicPolicy", "AWS::KMS::Alias",
		"AWS::CloudWatch::Alarm", "AWS::CloudWatch::Dashboard", "AWS::Events::EventBusPolicy":
		return true
	}

	return strings.HasPrefix(typ, "AWS::IAM::")
}

func newProvisioner(t *template, stackName, endpoint string, log *slog.Logger) *provisioner {
	cfg := AWSConfig(endpoint)

	return &provisioner{
		t:              t,
		stackName:      stackName,
		res:            newResolver(t, stackName),
		log:            log,
		dynamodb:       dynamodb.NewFromConfig(cfg),
		lambda:         lambda.NewFromConfig(cfg),
		apigateway:     apigateway.NewFromConfig(cfg),
		sfn:            sfn.NewFromConfig(cfg),
		eventbridge:    eventbridge.NewFromConfig(cfg),
		secretsmanager: secretsmanager.NewFromConfig(cfg),
		sqs:            sqs.NewFromConfig(cfg),
		scheduler:      scheduler.NewFromConfig(cfg),
		kms:            kms.NewFromConfig(cfg),
		queueURLs:      map[string]string{},
		restAPIs:       map[string]string{},
		skipped:        map[string]int{},
		unknown:        map[string]int{},
	}
}

// run provisions every resource of the template.
func (p *provisioner) run(ctx context.Context) error {
	order, err := p.t.order()
	if err != nil {
		return err
	}

	for _, id := range order {
		r := p.t.Resources[id]

		if r.Condition != "" {
			ok, err := p.res.condition(r.Condition)
			if err != nil {
				return fmt.Errorf("resource %s: %w", id, err)
			}

			if !ok {
				p.log.Debug("resource excluded by its condition", "resource", id, "condition", r.Condition)

				continue
			}
		}

		create, ok := provisioners[r.Type]
		if !ok {
			if skippedType(r.Type) {
				p.skipped[r.Type]++
			} else {
				p.unknown[r.Type]++
			}

			// References to it must still resolve, e.g. a function's Role.
			p.res.resources[id] = fakePhysical(p.stackName, id, r)

			continue
		}

		props, err := p.res.resolve(r.Properties)
		if err != nil {
			return fmt.Errorf("resolve %s (%s) properties: %w", id, r.Type, err)
		}

		propMap, _ := props.(map[string]any)
		if propMap == nil {
			propMap = map[string]any{}
		}

		phys, err := create(ctx, p, id, r, propMap)
		if err != nil {
			return fmt.Errorf("provision %s (%s): %w", id, r.Type, err)
		}

		p.res.resources[id] = phys
		p.log.Debug("provisioned", "resource", id, "type", r.Type, "ref", phys.ref)
	}

	if len(p.skipped) > 0 {
		p.log.Info("skipped resources not needed locally", "types", countList(p.skipped))
	}

	if len(p.unknown) > 0 {
		p.log.Warn("skipped resources of types the local stack does not support", "types", countList(p.unknown))
	}

	return nil
}

// countList formats {type: n} as "AWS::IAM::Role=2 AWS::Lambda::Permission=1".
func countList(m map[string]int) string {
	parts := make([]string, 0, len(m))
	for _, typ := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, typ+"="+strconv.Itoa(m[typ]))
	}

	return strings.Join(parts, " ")
}

// fakePhysical gives a skipped resource the Ref and Arn it would have on AWS, close enough for
// the properties that mention it (kumo checks neither roles nor log groups).
func fakePhysical(stackName, id string, r *resource) *physical {
	name := generatedName(stackName, id, 64)

	for _, key := range []string{"RoleName", "PolicyName", "ManagedPolicyName", "LogGroupName", "UserName", "GroupName", "Name"} {
		if s, ok := r.Properties[key].(string); ok && s != "" {
			name = s

			break
		}
	}

	service, kind := "unknown", "resource"
	if parts := strings.Split(r.Type, "::"); len(parts) == 3 {
		service, kind = strings.ToLower(parts[1]), strings.ToLower(parts[2])
	}

	arn := fmt.Sprintf("arn:%s:%s:%s:%s:%s/%s", partition, service, region, accountID, kind, name)
	ref := name

	switch r.Type {
	case "AWS::IAM::Role":
		arn = fmt.Sprintf("arn:%s:iam::%s:role/%s", partition, accountID, name)
	case "AWS::IAM::ManagedPolicy":
		arn = fmt.Sprintf("arn:%s:iam::%s:policy/%s", partition, accountID, name)
		ref = arn // Ref of a managed policy is its ARN
	case "AWS::Logs::LogGroup":
		arn = fmt.Sprintf("arn:%s:logs:%s:%s:log-group:%s:*", partition, region, accountID, name)
	}

	return &physical{ref: ref, attrs: map[string]any{"Arn": arn}, fake: true}
}

// generatedName stands in for the name CloudFormation generates when a template gives none.
// It is stable across runs so that local names are predictable.
func generatedName(stackName, id string, limit int) string {
	name := stackName + "-" + id
	if len(name) <= limit {
		return name
	}

	sum := sha256.Sum256([]byte(name))

	return name[:limit-9] + "-" + hex.EncodeToString(sum[:4])
}

// decodeProps turns resolved properties into a typed struct named after CloudFormation's fields.
func decodeProps(props map[string]any, v any) error {
	data, err := json.Marshal(props)
	if err != nil {
		return fmt.Errorf("encode properties: %w", err)
	}

	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()

	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decode properties: %w", err)
	}

	return nil
}

// cfnInt accepts a number or a numeric string, as CloudFormation does.
type cfnInt int64

func (n *cfnInt) UnmarshalJSON(data []byte) error {
	s := strings.Trim(string(data), `"`)
	if s == "" || s == "null" {
		return nil
	}

	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return fmt.Errorf("want an integer, got %s", data)
	}

	*n = cfnInt(v)

	return nil
}

// cfnBool accepts true/false or "true"/"false", as CloudFormation does.
type cfnBool bool

func (b *cfnBool) UnmarshalJSON(data []byte) error {
	s := strings.Trim(string(data), `"`)
	if s == "" || s == "null" {
		return nil
	}

	v, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("want a boolean, got %s", data)
	}

	*b = cfnBool(v)

	return nil
}

// stringMap turns resolved map values (strings, numbers, booleans) into strings.
func stringMap(m map[string]any) (map[string]string, error) {
	if len(m) == 0 {
		return nil, nil
	}

	out := make(map[string]string, len(m))

	for k, v := range m {
		s, err := scalarString(v)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}

		out[k] = s
	}

	return out, nil
}

func optString(s string) *string {
	if s == "" {
		return nil
	}

	return aws.String(s)
}
