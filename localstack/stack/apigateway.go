package stack

import (
	"github.com/openrelay/capacity/localstack/quota"

	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/apigateway"
	"github.com/aws/aws-sdk-go-v2/service/apigateway/types"
)

// stableAPIID is the id under which the runner serves the stack's RestApi logicalID: kumo
// gives each CreateRestApi a random id (a UUID's first 10 characters, with no custom-id tag as
// LocalStack's), so the URL `make run` prints would change at every run; the proxy answers
// this one, derived from the stack name and the logical id, in its place (and the random one
// too). Ten lowercase hex characters, as an API Gateway id is ten lowercase alphanumerics.
func stableAPIID(stackName, logicalID string) string {
	sum := sha256.Sum256([]byte(stackName + "/" + logicalID))
	return hex.EncodeToString(sum[:])[:10]
}

func provisionRestAPI(ctx context.Context, p *provisioner, id string, _ *resource, props map[string]any) (*physical, error) {
	var api struct {
		Name             string
		Description      string
		BinaryMediaTypes []string
		Body             any
		BodyS3Location   any
	}
	if err := decodeProps(props, &api); err != nil {
		return nil, err
	}

	if api.Body != nil || api.BodyS3Location != nil {
		// An imported OpenAPI definition would need kumo's ImportRestApi, which it lacks.
		p.log.Warn("RestApi OpenAPI body is not imported locally; only Resource/Method resources are created", "resource", id)
	}

	name := valueOr(api.Name, generatedName(p.stackName, id, 255))

	out, err := p.apigateway.CreateRestApi(ctx, &apigateway.CreateRestApiInput{
		Name:             aws.String(name),
		Description:      optString(api.Description),
		BinaryMediaTypes: api.BinaryMediaTypes,
	})
	if err != nil {
		return nil, fmt.Errorf("create rest api %s: %w", name, err)
	}

	apiID := aws.ToString(out.Id)
	p.restAPIs[apiID] = stableAPIID(p.stackName, id)
	p.log.Info("created rest api", "name", name, "id", apiID, "stableId", p.restAPIs[apiID])

	return &physical{ref: apiID, attrs: map[string]any{
		"RestApiId":      apiID,
		"RootResourceId": aws.ToString(out.RootResourceId),
	}}, nil
}

func provisionAPIResource(ctx context.Context, p *provisioner, _ string, _ *resource, props map[string]any) (*physical, error) {
	var res struct{ RestApiId, ParentId, PathPart string }
	if err := decodeProps(props, &res); err != nil {
		return nil, err
	}

	out, err := p.apigateway.CreateResource(ctx, &apigateway.CreateResourceInput{
		RestApiId: aws.String(res.RestApiId),
		ParentId:  aws.String(res.ParentId),
		PathPart:  aws.String(res.PathPart),
	})
	if err != nil {
		return nil, fmt.Errorf("create resource %s: %w", res.PathPart, err)
	}

	resourceID := aws.ToString(out.Id)

	return &physical{ref: resourceID, attrs: map[string]any{"ResourceId": resourceID}}, nil
}

type cfnMethod struct {
	RestApiId         string
	ResourceId        string
	HttpMethod        string
	AuthorizationType string
	AuthorizerId      string
	ApiKeyRequired    cfnBool
	Integration       *struct {
		Type                  string
		IntegrationHttpMethod string
		Uri                   string
		PassthroughBehavior   string
		ContentHandling       string
		TimeoutInMillis       cfnInt
		RequestTemplates      map[string]string
		RequestParameters     map[string]string
	}
}

func provisionMethod(ctx context.Context, p *provisioner, _ string, _ *resource, props map[string]any) (*physical, error) {
	var m cfnMethod
	if err := decodeProps(props, &m); err != nil {
		return nil, err
	}

	_, err := p.apigateway.PutMethod(ctx, &apigateway.PutMethodInput{
		RestApiId:         aws.String(m.RestApiId),
		ResourceId:        aws.String(m.ResourceId),
		HttpMethod:        aws.String(m.HttpMethod),
		AuthorizationType: aws.String(valueOr(m.AuthorizationType, "NONE")),
		AuthorizerId:      optString(m.AuthorizerId),
		ApiKeyRequired:    bool(m.ApiKeyRequired),
	})
	if err != nil {
		return nil, fmt.Errorf("put method %s on resource %s: %w", m.HttpMethod, m.ResourceId, err)
	}

	if in := m.Integration; in != nil {
		put := &apigateway.PutIntegrationInput{
			RestApiId:             aws.String(m.RestApiId),
			ResourceId:            aws.String(m.ResourceId),
			HttpMethod:            aws.String(m.HttpMethod),
			Type:                  types.IntegrationType(in.Type),
			IntegrationHttpMethod: optString(in.IntegrationHttpMethod),
			Uri:                   optString(in.Uri),
			PassthroughBehavior:   optString(in.PassthroughBehavior),
			RequestTemplates:      in.RequestTemplates,
			RequestParameters:     in.RequestParameters,
		}
		if in.ContentHandling != "" {
			put.ContentHandling = types.ContentHandlingStrategy(in.ContentHandling)
		}

		if in.TimeoutInMillis > 0 {
			put.TimeoutInMillis = aws.Int32(int32(in.TimeoutInMillis))
		}

		if _, err := p.apigateway.PutIntegration(ctx, put); err != nil {
			return nil, fmt.Errorf("put %s integration for method %s: %w", in.Type, m.HttpMethod, err)
		}
	}

	// CloudFormation's Ref of a method is an opaque id; nothing local reads it.
	return &physical{ref: m.RestApiId + "-" + m.ResourceId + "-" + m.HttpMethod, attrs: map[string]any{}}, nil
}

func provisionDeployment(ctx context.Context, p *provisioner, _ string, _ *resource, props map[string]any) (*physical, error) {
	var d struct{ RestApiId, Description, StageName string }
	if err := decodeProps(props, &d); err != nil {
		return nil, err
	}

	out, err := p.apigateway.CreateDeployment(ctx, &apigateway.CreateDeploymentInput{
		RestApiId:   aws.String(d.RestApiId),
		Description: optString(d.Description),
		// Set only by templates that create the stage with the deployment; CDK uses a Stage.
		StageName: optString(d.StageName),
	})
	if err != nil {
		return nil, fmt.Errorf("create deployment of rest api %s: %w", d.RestApiId, err)
	}

	deploymentID := aws.ToString(out.Id)

	return &physical{ref: deploymentID, attrs: map[string]any{"DeploymentId": deploymentID}}, nil
}

func provisionStage(ctx context.Context, p *provisioner, _ string, _ *resource, props map[string]any) (*physical, error) {
	var st struct {
		RestApiId, DeploymentId, StageName, Description string
		Variables                                       map[string]string
		MethodSettings                                  []struct {
			HTTPMethod           string `json:"HttpMethod"`
			ResourcePath         string
			ThrottlingRateLimit  float64
			ThrottlingBurstLimit float64
		}
	}
	if err := decodeProps(props, &st); err != nil {
		return nil, err
	}

	_, err := p.apigateway.CreateStage(ctx, &apigateway.CreateStageInput{
		RestApiId:    aws.String(st.RestApiId),
		DeploymentId: aws.String(st.DeploymentId),
		StageName:    aws.String(st.StageName),
		Description:  optString(st.Description),
		Variables:    st.Variables,
	})
	if err != nil {
		return nil, fmt.Errorf("create stage %s of rest api %s: %w", st.StageName, st.RestApiId, err)
	}

	p.log.Info("created api stage", "api", st.RestApiId, "stage", st.StageName)

	// The stage's default method throttle (every method, every path) is what the quota model
	// applies; a per-method setting is not modelled.
	for _, ms := range st.MethodSettings {
		if ms.HTTPMethod == "*" && ms.ResourcePath == "/*" && ms.ThrottlingRateLimit > 0 {
			p.quotaRes.Stages = append(p.quotaRes.Stages, quota.Stage{APIID: st.RestApiId, Name: st.StageName,
				Rate: ms.ThrottlingRateLimit, Burst: ms.ThrottlingBurstLimit})
		}
	}

	return &physical{ref: st.StageName, attrs: map[string]any{}}, nil
}
