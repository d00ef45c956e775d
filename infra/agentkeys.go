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
// the KMS key random agent keys are sealed under. breakGlassRole (a role ARN, or "") may open
// agent keys and read the master secret besides terminate-node.
func (s *CapacityStack) newAgentKeys(existingSecret, breakGlassRole string) {
	s.agentMasterSecretID, s.agentMasterSecretARN = s.agentMasterSecret(existingSecret)
	s.agentKeysBreakGlassRole = breakGlassRole
	s.AgentKeysKey = s.newAgentKeysKey()
}

// newAgentKeysKey is the KMS key the nodes' agent keys are sealed under (capacity-<env>-agent-keys),
// rotated yearly, kept with the stack's data (a lost key loses every sealed agent key).
//
// Its policy does not delegate use to IAM (no kms:* for the account): the account may
// administer the key (so it is never unmanageable, and CloudFormation can update it) but not
// use it; the roles that seal or open agent keys are named in the policy one by one
// (allowAgentKeys), and so is the break-glass role. A role of the account allowed kms:Decrypt
// on "*" thereby opens no agent key.
func (s *CapacityStack) newAgentKeysKey() awskms.Key {
	policy := awsiam.NewPolicyDocument(&awsiam.PolicyDocumentProps{})
	policy.AddStatements(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String("AccountAdministersNotUses"),
		Effect:     awsiam.Effect_ALLOW,
		Principals: &[]awsiam.IPrincipal{awsiam.NewAccountRootPrincipal()},
		Actions:    jsii.Strings(agentKeysAdminActions...),
		Resources:  jsii.Strings("*"),
	}))
	if s.agentKeysBreakGlassRole != "" {
		cond := agentKeyContext()
		policy.AddStatements(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid:        jsii.String("BreakGlassOpensAgentKeys"),
			Effect:     awsiam.Effect_ALLOW,
			Principals: &[]awsiam.IPrincipal{awsiam.NewArnPrincipal(jsii.String(s.agentKeysBreakGlassRole))},
			Actions:    jsii.Strings("kms:Decrypt"),
			Resources:  jsii.Strings("*"),
			Conditions: &cond,
		}))
	}
	return awskms.NewKey(s.Stack, jsii.String("AgentKeysKey"), &awskms.KeyProps{
		Alias:             jsii.String("alias/" + stackname.Resource(s.Env, "agent-keys")),
		Description:       jsii.String("Seals the node agents' keys (encryption context purpose=" + agentKeyPurpose + ", nodeId), " + s.Env),
		EnableKeyRotation: jsii.Bool(true),
		RemovalPolicy:     s.removalPolicy(),
		Policy:            policy,
	})
}

// agentKeysAdminActions are what the account (its administrators, through IAM) may do to the
// agent keys' key: manage it, its policy, alias, tags, rotation and deletion. No action that
// encrypts, decrypts, re-encrypts, makes a data key or creates a grant.
var agentKeysAdminActions = []string{
	"kms:CancelKeyDeletion", "kms:CreateAlias", "kms:DeleteAlias", "kms:DescribeKey", "kms:DisableKey",
	"kms:DisableKeyRotation", "kms:EnableKey", "kms:EnableKeyRotation", "kms:GetKeyPolicy",
	"kms:GetKeyRotationStatus", "kms:ListAliases", "kms:ListGrants", "kms:ListKeyPolicies",
	"kms:ListKeyRotations", "kms:ListResourceTags", "kms:PutKeyPolicy", "kms:RetireGrant", "kms:RevokeGrant",
	"kms:RotateKeyOnDemand", "kms:ScheduleKeyDeletion", "kms:TagResource", "kms:UntagResource",
	"kms:UpdateAlias", "kms:UpdateKeyDescription",
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

// allowAgentKeys grants fn these actions on the agent keys' KMS key, for agent keys only: in
// its role's policy and, naming its role, in the key's own (which delegates no use to IAM).
func (s *CapacityStack) allowAgentKeys(fn awslambda.Function, sid string, actions ...string) {
	cond := agentKeyContext()
	fn.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String(sid),
		Effect:     awsiam.Effect_ALLOW,
		Actions:    jsii.Strings(actions...),
		Resources:  &[]*string{s.AgentKeysKey.KeyArn()},
		Conditions: &cond,
	}))
	s.AgentKeysKey.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String(sid),
		Effect:     awsiam.Effect_ALLOW,
		Principals: &[]awsiam.IPrincipal{awsiam.NewArnPrincipal(fn.Role().RoleArn())},
		Actions:    jsii.Strings(actions...),
		Resources:  jsii.Strings("*"),
		Conditions: &cond,
	}), jsii.Bool(false))
}

// restrictAgentMasterSecret gives the master secret a resource policy that denies
// GetSecretValue to every principal but the readers and the break-glass role, whatever their
// identity policies say (an administrator's "*" included). An existing secret
// (agentMasterSecret in cdk.json) gets the same policy, replacing any it had.
func (s *CapacityStack) restrictAgentMasterSecret(readers ...awslambda.Function) {
	arns := []*string{}
	for _, fn := range readers {
		arns = append(arns, fn.Role().RoleArn())
	}
	if s.agentKeysBreakGlassRole != "" {
		arns = append(arns, jsii.String(s.agentKeysBreakGlassRole))
	}
	doc := awsiam.NewPolicyDocument(&awsiam.PolicyDocumentProps{Statements: &[]awsiam.PolicyStatement{
		awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid:        jsii.String("OnlyItsReadersGetTheValue"),
			Effect:     awsiam.Effect_DENY,
			Principals: &[]awsiam.IPrincipal{awsiam.NewAnyPrincipal()},
			Actions:    jsii.Strings("secretsmanager:GetSecretValue"),
			Resources:  jsii.Strings("*"),
			Conditions: &map[string]any{"StringNotEquals": map[string]any{"aws:PrincipalArn": arns}},
		}),
	}})
	awssecretsmanager.NewCfnResourcePolicy(s.Stack, jsii.String("AgentMasterSecretPolicy"), &awssecretsmanager.CfnResourcePolicyProps{
		SecretId:          s.agentMasterSecretID,
		ResourcePolicy:    doc,
		BlockPublicPolicy: jsii.Bool(true),
	})
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
