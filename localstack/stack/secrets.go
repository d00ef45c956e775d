package stack

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager/types"
)

// cfnSecret is the part of AWS::SecretsManager::Secret the runner reads.
type cfnSecret struct {
	Name                 string
	Description          string
	SecretString         string
	GenerateSecretString *cfnSecretGenerator
}

// cfnSecretGenerator is the part of GenerateSecretString the runner reads.
type cfnSecretGenerator struct {
	PasswordLength       json.Number
	ExcludePunctuation   bool
	SecretStringTemplate string
	GenerateStringKey    string
}

const (
	alphanumerics = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	punctuation   = "!#$%&()*+,-./:;<=>?@[]^_{|}~"
)

// provisionSecret creates the secret in the emulator's Secrets Manager with its SecretString,
// or a value generated the way CloudFormation does (random characters, PasswordLength, default
// 32; into GenerateStringKey of SecretStringTemplate when given). Functions read it at run time
// as on AWS; tools read it back by the ARN (Ref) from the stack outputs. A secret left by an
// earlier stack in the same process (kumo's storage is per process) is reused as it is.
func provisionSecret(ctx context.Context, p *provisioner, id string, _ *resource, props map[string]any) (*physical, error) {
	var sec cfnSecret
	if err := decodeProps(props, &sec); err != nil {
		return nil, err
	}
	if sec.Name == "" {
		sec.Name = generatedName(p.stackName, id, 512)
	}
	value, err := secretValue(sec)
	if err != nil {
		return nil, fmt.Errorf("secret %s: %w", sec.Name, err)
	}
	arn := ""
	out, err := p.secretsmanager.CreateSecret(ctx, &secretsmanager.CreateSecretInput{
		Name: aws.String(sec.Name), Description: optString(sec.Description), SecretString: aws.String(value),
	})
	var exists *types.ResourceExistsException
	switch {
	case errors.As(err, &exists):
		d, err := p.secretsmanager.DescribeSecret(ctx, &secretsmanager.DescribeSecretInput{SecretId: aws.String(sec.Name)})
		if err != nil {
			return nil, fmt.Errorf("describe existing secret %s: %w", sec.Name, err)
		}
		arn = aws.ToString(d.ARN)
	case err != nil:
		return nil, fmt.Errorf("create secret %s: %w", sec.Name, err)
	default:
		arn = aws.ToString(out.ARN)
	}
	// Ref of a secret is its ARN.
	return &physical{ref: arn, attrs: map[string]any{"Id": arn}}, nil
}

func secretValue(sec cfnSecret) (string, error) {
	g := sec.GenerateSecretString
	if g == nil {
		if sec.SecretString == "" {
			return "", errors.New("neither SecretString nor GenerateSecretString")
		}
		return sec.SecretString, nil
	}
	n := int64(32)
	if g.PasswordLength != "" {
		var err error
		if n, err = g.PasswordLength.Int64(); err != nil || n < 1 || n > 4096 {
			return "", fmt.Errorf("PasswordLength %s: want 1 to 4096", g.PasswordLength)
		}
	}
	chars := alphanumerics
	if !g.ExcludePunctuation {
		chars += punctuation
	}
	b := make([]byte, n)
	for i := range b {
		k, err := rand.Int(rand.Reader, big.NewInt(int64(len(chars))))
		if err != nil {
			return "", err
		}
		b[i] = chars[k.Int64()]
	}
	if g.GenerateStringKey == "" {
		return string(b), nil
	}
	doc := map[string]any{}
	if g.SecretStringTemplate != "" {
		if err := json.Unmarshal([]byte(g.SecretStringTemplate), &doc); err != nil {
			return "", fmt.Errorf("SecretStringTemplate: %w", err)
		}
	}
	doc[g.GenerateStringKey] = string(b)
	v, err := json.Marshal(doc)
	return string(v), err
}

// ReadSecret reads the current value of a secret of the stack at endpoint, such as the agent
// master secret by the AgentMasterSecretId output: the runner's tools stand in for what holds
// it on AWS (the node agent simulator gives each simulated agent its own derived key).
func ReadSecret(ctx context.Context, endpoint, secretID string) ([]byte, error) {
	if secretID == "" {
		return nil, errors.New("read secret: no secret id (is AgentMasterSecretId in the stack outputs?)")
	}
	out, err := secretsmanager.NewFromConfig(AWSConfig(endpoint)).GetSecretValue(ctx,
		&secretsmanager.GetSecretValueInput{SecretId: aws.String(secretID)})
	if err != nil {
		return nil, fmt.Errorf("read secret %s: %w", secretID, err)
	}
	if out.SecretString != nil {
		return []byte(*out.SecretString), nil
	}
	return out.SecretBinary, nil
}
