package main

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awskms"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/jsii-runtime-go"

	"github.com/openrelay/capacity/shared/stackname"
)

// newAgentKeys creates what the node agents' keys come from: the master secret the keys of
// nodes at key generation 0 are derived from (existingSecret, or one the stack creates), and
// the KMS key random agent keys are sealed under.
func (s *CapacityStack) newAgentKeys(existingSecret string) {
	s.agentMasterSecretID, s.agentMasterSecretARN = s.agentMasterSecret(existingSecret)
	s.AgentKeysKey = s.newAgentKeysKey()
}

// newAgentKeysKey is the KMS key the nodes' agent keys are sealed under (capacity-<env>-agent-keys),
// rotated yearly, kept with the stack's data (a lost key loses every sealed agent key).
func (s *CapacityStack) newAgentKeysKey() awskms.Key {
	return awskms.NewKey(s.Stack, jsii.String("AgentKeysKey"), &awskms.KeyProps{
		Alias:             jsii.String("alias/" + stackname.Resource(s.Env, "agent-keys")),
		Description:       jsii.String("Seals the node agents' keys (encryption context purpose=" + agentKeyPurpose + ", nodeId), " + s.Env),
		EnableKeyRotation: jsii.Bool(true),
		RemovalPolicy:     s.removalPolicy(),
	})
}

// agentKeyPurpose is the encryption context purpose of every sealed agent key (shared/kmsseal).
const agentKeyPurpose = "capacity-agent-key"

// agentKeyContext conditions a grant on the key to agent keys: the purpose, and a node id.
func agentKeyContext() map[string]any {
	return map[string]any{
		"StringEquals": map[string]any{"kms:EncryptionContext:purpose": agentKeyPurpose},
		"Null":         map[string]any{"kms:EncryptionContext:nodeId": "false"},
	}
}

// allowAgentKeys grants fn these actions on the agent keys' KMS key, for agent keys only.
func allowAgentKeys(fn awslambda.Function, sid string, key awskms.Key, actions ...string) {
	cond := agentKeyContext()
	fn.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String(sid),
		Effect:     awsiam.Effect_ALLOW,
		Actions:    jsii.Strings(actions...),
		Resources:  &[]*string{key.KeyArn()},
		Conditions: &cond,
	}))
}

// denyAgentKeysOpen denies fn's role, in the key's own policy, every action that would give it
// an agent key in clear or under another key, so no grant added to the role later can.
func (s *CapacityStack) denyAgentKeysOpen(fn awslambda.Function) {
	s.AgentKeysKey.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String("ApiMayNotOpenAgentKeys"),
		Effect:     awsiam.Effect_DENY,
		Principals: &[]awsiam.IPrincipal{awsiam.NewArnPrincipal(fn.Role().RoleArn())},
		Actions:    jsii.Strings("kms:Decrypt", "kms:ReEncryptFrom", "kms:ReEncryptTo", "kms:GenerateDataKey*", "kms:CreateGrant"),
		Resources:  jsii.Strings("*"),
	}), jsii.Bool(false))
}

// agentMasterSecret is the secret the node agents' keys are derived from: the existing secret
// name, or else one the stack creates, capacity/<env>/agent-master, 64 random alphanumerics,
// kept (RETAIN) outside local and dev since every agent's key depends on it. It returns the id
// terminate-node reads it by, and the ARN its policy grants. The value never enters the
// template or the function's configuration: the function reads it at run time.
func (s *CapacityStack) agentMasterSecret(existing string) (id, arn *string) {
	if existing != "" {
		s.AgentMasterSecret = awssecretsmanager.Secret_FromSecretNameV2(s.Stack, jsii.String("AgentMasterSecret"), jsii.String(existing))
		// A secret's ARN ends in "-" and 6 random characters that a name does not carry.
		return jsii.String(existing), awscdk.Fn_Sub(jsii.String(
			"arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:"+existing+"-??????"), nil)
	}
	secret := awssecretsmanager.NewSecret(s.Stack, jsii.String("AgentMasterSecret"), &awssecretsmanager.SecretProps{
		SecretName:  jsii.String("capacity/" + s.Env + "/agent-master"),
		Description: jsii.String("Master secret of the node agents' keys (HKDF per node; agent contract v2), " + s.Env),
		GenerateSecretString: &awssecretsmanager.SecretStringGenerator{
			PasswordLength: jsii.Number(64), ExcludePunctuation: jsii.Bool(true), IncludeSpace: jsii.Bool(false),
		},
		RemovalPolicy: s.removalPolicy(),
	})
	s.AgentMasterSecret = secret
	return secret.SecretArn(), secret.SecretArn()
}
