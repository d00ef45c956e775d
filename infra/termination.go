package main

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsstepfunctions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsstepfunctionstasks"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"

	"github.com/openrelay/capacity/shared/config/envvar"
	"github.com/openrelay/capacity/shared/stackname"
	"github.com/openrelay/capacity/shared/stepfn"
	"github.com/openrelay/capacity/shared/table"
)

// Termination workflow defaults, overridable per environment (cdk.json "termination").
const (
	DefaultTerminateRounds = 5 // rounds of the node before a VM's failure is final
	// Seconds between two rounds: short where nobody waits on real agents.
	DefaultTerminateRetryWaitEphemeral = 2
	DefaultTerminateRetryWait          = 10
)

// LocalExecutionArn stands in for $$.Execution.Id in env "local": the offline emulator (kumo
// v0.33.1) has no Context object besides $$.Map.Item in a Map's ItemSelector and fails the
// state on any other $$ reference. See terminateNodePayload.
const LocalExecutionArn = "local:no-execution-context"

// terminateRetryErrors are the platform errors the TerminateNode task retries. Business
// failures (an agent refusing or unreachable) are not errors: the function reports them in its
// output and the workflow retries them in its next round.
var terminateRetryErrors = []string{
	"Lambda.ServiceException", "Lambda.AWSLambdaException", "Lambda.SdkClientException",
	"Lambda.TooManyRequestsException", "States.Timeout",
}

// newTerminateNodeFunction creates terminate-node, the workflow task that runs one round of
// one node's terminations: it calls the node's agent with the node's key and records each
// VM's outcome.
func (s *CapacityStack) newTerminateNodeFunction() awslambda.Function {
	state := s.table(table.State)
	env := map[envvar.Variable]*string{
		envvar.StateTable: state.TableName(), envvar.AgentMasterSecretID: s.agentMasterSecretID,
		envvar.AgentTimeout:      jsii.String(envvar.AgentTimeout.DefaultText()),
		envvar.AgentKeysKMSKeyID: s.AgentKeysKey.KeyArn(),
	}
	if s.Env == LocalEnv {
		// The local stack's agents listen on loopback, over plain http. Nowhere else.
		env[envvar.AgentAllowHTTP] = jsii.String("true")
	}
	fn := s.goFunction(goFunctionSpec{Function: envvar.TerminateNode, MemoryMB: 256,
		Timeout: awscdk.Duration_Seconds(jsii.Number(60)), Environment: env})
	// Reads the agent master secret at run time (current and previous versions), for nodes
	// still at key generation 0 and to reseal the keys it opened; nothing else in Secrets
	// Manager. Opens the nodes' sealed keys (once per key generation: then the resealed form).
	allowOn(fn, "AgentMasterSecretRead", s.agentMasterSecretARN, "secretsmanager:GetSecretValue")
	s.allowAgentKeys(fn, "AgentKeysOpen", "kms:Decrypt")
	s.restrictAgentMasterSecret(fn)
	// Reads the operation and the node, moves each terminated VM from the node's decision
	// partition to its history (one transaction: a conditional delete and a put), moves the
	// operation on with conditional updates, puts each VM's outcome item (a conditional put
	// of its own) and each node's resealed agent key (a conditional put: never over a later
	// generation's). No audit access.
	allow(fn, "StateTable", state, "dynamodb:GetItem", "dynamodb:Query", "dynamodb:UpdateItem", "dynamodb:PutItem", "dynamodb:DeleteItem")
	return fn
}

// newTerminationStateMachine builds "capacity-<env>-termination-express", an EXPRESS machine: every
// run is one step of a reclaim operation's attempt and ends within seconds; no state waits.
// The waits (the grace left, the retry wait between rounds) are the delays of the messages a
// step sends to the termination-steps queue, whose function starts the next step's run.
//
// The first step's input, written by the API and the reconciler (stepfn.Input), is
// {"step": "first", "reclaimId": "rcl_..", "attempt": 1, "nodeId": "n1", "vmIds": [..],
// "round": 0, "terminateAfter": "<RFC 3339 UTC>", "dueAt": "<RFC 3339 UTC, ns>",
// "delaySeconds": <grace left, rounded up>}; a later step's, from the queue (stepfn.Step), is
// {"step": "round", "reclaimId", "nodeId", "attempt", "round", "vmIds", "maxRounds", "dueAt"}.
// A reclaim operation is one node's.
//
//	Step?  $.step == "round" -> TerminateNode, else NotifyAgents
//	NotifyAgents (terminate-node, agentNotices: each victim's notice to its agent; result
//	    discarded; any error caught and passed over: the notices never hold the termination)
//	Notify (operation-events, phase notice: the victims' eviction notices; result discarded)
//	GraceLeft?  $.delaySeconds > 0 -> ScheduleRound, else TerminateNode
//	ScheduleRound (sqs:sendMessage: round 0, DelaySeconds = $.delaySeconds) -> Scheduled
//	TerminateNode (terminate-node, one round)    -> AllTerminated?
//	AllTerminated?  $.done == true -> Report, else ScheduleRetry
//	ScheduleRetry (sqs:sendMessage: the next round, DelaySeconds = retryWait) -> Scheduled
//	Report (operation-events, phase report: the VMs' outcomes and the operation's end, then the
//	    end written on the operation; result discarded)
//	Scheduled (Succeed)
//
// terminate-node gets the task (terminateNodePayload) and returns the same shape with vmIds =
// the VMs still to retry, round = the next round, dueAt = when it may run, and done,
// terminated, alreadyGone, failed: the state ScheduleRetry's message, and Report's payload, are
// read from. Business failures are data, not errors: the task retries only platform errors
// (which is also all a Retry can catch on the local emulator, where a function error comes
// back as normal output). A run succeeds whatever the VMs' fate: the operation record in
// DynamoDB says completed or failed.
//
// Runs are at least once (Express, and SQS): every task is safe to run twice at once (the
// terminate and report claims, conditional writes; docs/termination.md). A run that fails
// schedules nothing: its operation makes no progress, which the reconciler watches for.
//
// The notices come from the workflow, which the API starts right after its commit and the
// reconciler starts if the API died, so none is lost; their stable event ids absorb the
// duplicates of a restart.
func (s *CapacityStack) newTerminationStateMachine(fn, eventsFn awslambda.IFunction, rounds, retryWait float64) awsstepfunctions.StateMachine {
	smName := stackname.Resource(s.Env, "termination-express")
	sec := func(n float64) awscdk.Duration { return awscdk.Duration_Seconds(jsii.Number(n)) }
	// The states' construct ids are their state names, under a scope of their own.
	c := constructs.NewConstruct(s.Stack, jsii.String("TerminationWorkflow"))

	task := awsstepfunctionstasks.NewLambdaInvoke(c, jsii.String("TerminateNode"), &awsstepfunctionstasks.LambdaInvokeProps{
		StateName:      jsii.String("TerminateNode"),
		LambdaFunction: fn,
		Payload:        awsstepfunctions.TaskInput_FromObject(s.terminateNodePayload(rounds, retryWait)),
		// The function's returned payload (lambda:invoke wraps it in {StatusCode, Payload, ...}).
		OutputPath: jsii.String("$.Payload"),
		// Our own Retry below, instead of CDK's default one (which adds Lambda.ClientExecutionTimeoutException).
		RetryOnServiceExceptions: jsii.Bool(false),
		// Above the function's 60 s timeout, so that a slow but finished invocation is not cut off.
		TaskTimeout: awsstepfunctions.Timeout_Duration(sec(90)),
	})
	addTaskRetries(task)

	// operation-events reads the operation by the ids of the state (the execution input, or
	// the last round's output, which carries them on); both phases are safe to repeat (stable
	// event ids, the report's claim), so they retry like TerminateNode.
	publish := func(state, phase string) awsstepfunctionstasks.LambdaInvoke {
		t := awsstepfunctionstasks.NewLambdaInvoke(c, jsii.String(state), &awsstepfunctionstasks.LambdaInvokeProps{
			StateName:      jsii.String(state),
			LambdaFunction: eventsFn,
			Payload: awsstepfunctions.TaskInput_FromObject(&map[string]any{
				"phase":     phase,
				"reclaimId": awsstepfunctions.JsonPath_StringAt(jsii.String("$.reclaimId")),
				"nodeId":    awsstepfunctions.JsonPath_StringAt(jsii.String("$.nodeId")),
				"attempt":   awsstepfunctions.JsonPath_NumberAt(jsii.String("$.attempt")),
			}),
			// The next state needs the state as it was, not the function's answer.
			ResultPath:               awsstepfunctions.JsonPath_DISCARD(),
			RetryOnServiceExceptions: jsii.Bool(false),
			// Above the function's 30 s timeout.
			TaskTimeout: awsstepfunctions.Timeout_Duration(sec(45)),
		})
		addTaskRetries(t)
		return t
	}
	scheduled := awsstepfunctions.NewSucceed(c, jsii.String("Scheduled"), &awsstepfunctions.SucceedProps{StateName: jsii.String("Scheduled")})
	// Round 0, after the grace left: the first step's input has no maxRounds of its own.
	scheduleRound := s.scheduleStep(c, "ScheduleRound", map[string]any{"DelaySeconds.$": "$.delaySeconds"},
		map[string]any{"maxRounds": rounds}).Next(scheduled)
	scheduleRetry := s.scheduleStep(c, "ScheduleRetry", map[string]any{"DelaySeconds": retryWait},
		map[string]any{"maxRounds.$": "$.maxRounds"}).Next(scheduled)
	choice := awsstepfunctions.NewChoice(c, jsii.String("AllTerminated"), &awsstepfunctions.ChoiceProps{StateName: jsii.String("AllTerminated?")}).
		When(awsstepfunctions.Condition_BooleanEquals(jsii.String("$.done"), jsii.Bool(true)), publish("Report", stepfn.PhaseReport), nil).
		Otherwise(scheduleRetry)
	task.Next(choice)
	graceLeft := awsstepfunctions.NewChoice(c, jsii.String("GraceLeft"), &awsstepfunctions.ChoiceProps{StateName: jsii.String("GraceLeft?")}).
		When(awsstepfunctions.Condition_NumberGreaterThan(jsii.String("$.delaySeconds"), jsii.Number(0)), scheduleRound, nil).
		Otherwise(task)
	// The agents' notices first: the guest needs the time to checkpoint more than a rule does.
	notify := publish("Notify", stepfn.PhaseNotice)
	first := s.notifyAgents(c, fn, notify).Next(notify).Next(graceLeft)
	definition := awsstepfunctions.NewChoice(c, jsii.String("Step"), &awsstepfunctions.ChoiceProps{StateName: jsii.String("Step?")}).
		When(awsstepfunctions.Condition_StringEquals(jsii.String("$.step"), jsii.String(stepfn.StepRound)), task, nil).
		Otherwise(first)

	logs := s.logGroup(c, "/aws/vendedlogs/states/"+smName)
	sm := awsstepfunctions.NewStateMachine(c, jsii.String("StateMachine"), &awsstepfunctions.StateMachineProps{
		StateMachineName: jsii.String(smName),
		StateMachineType: awsstepfunctions.StateMachineType_EXPRESS,
		Comment:          jsii.String("Runs one step of a reclaim operation's termination: the notices, or a round of its node"),
		DefinitionBody:   awsstepfunctions.DefinitionBody_FromChainable(definition),
		// Express's longest. A step takes at most a notice phase and a round with their retries.
		Timeout: awscdk.Duration_Minutes(jsii.Number(5)),
		// Level ERROR: a succeeded run writes no log, so the logs cost nothing per reclaim; a
		// failed one's data says which step of which operation it was.
		Logs: &awsstepfunctions.LogOptions{
			Destination:          logs,
			Level:                awsstepfunctions.LogLevel_ERROR,
			IncludeExecutionData: jsii.Bool(true),
		},
		TracingEnabled: jsii.Bool(true),
		RemovalPolicy:  s.removalPolicy(),
	})
	// What ScheduleRound and ScheduleRetry send (the queue's policy admits this role).
	sm.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String("ScheduleSteps"),
		Effect:    awsiam.Effect_ALLOW,
		Actions:   jsii.Strings("sqs:SendMessage"),
		Resources: &[]*string{s.TerminationSteps.QueueArn()},
	}))
	return sm
}

// scheduleStep is a state that sends a round step (stepfn.Step) to the termination-steps
// queue with the delay given (DelaySeconds or DelaySeconds.$), read from the state: the
// first step's input (round 0) or a round's output (the next round). extra adds maxRounds.
// Retried on SQS's errors: the message is the step's only way on.
func (s *CapacityStack) scheduleStep(c constructs.Construct, name string, delay, extra map[string]any) awsstepfunctions.CustomState {
	body := map[string]any{
		"step":        stepfn.StepRound,
		"reclaimId.$": "$.reclaimId",
		"nodeId.$":    "$.nodeId",
		"attempt.$":   "$.attempt",
		"round.$":     "$.round",
		"vmIds.$":     "$.vmIds",
		"dueAt.$":     "$.dueAt",
	}
	for k, v := range extra {
		body[k] = v
	}
	params := map[string]any{"QueueUrl": s.TerminationSteps.QueueUrl(), "MessageBody": body}
	for k, v := range delay {
		params[k] = v
	}
	return awsstepfunctions.NewCustomState(c, jsii.String(name), &awsstepfunctions.CustomStateProps{
		StateJson: &map[string]any{
			"Type":       "Task",
			"Resource":   awscdk.Fn_Join(jsii.String(""), &[]*string{jsii.String("arn:"), awscdk.Aws_PARTITION(), jsii.String(":states:::sqs:sendMessage")}),
			"Parameters": params,
			"Retry": []any{map[string]any{
				"ErrorEquals": []string{"States.ALL"}, "IntervalSeconds": 1, "BackoffRate": 2, "MaxAttempts": 4,
			}},
		},
	})
}

// addTaskRetries gives a workflow task its retries: the platform errors of a Lambda invoke,
// then the function's own errors.
func addTaskRetries(task awsstepfunctionstasks.LambdaInvoke) {
	sec := func(n float64) awscdk.Duration { return awscdk.Duration_Seconds(jsii.Number(n)) }
	task.AddRetry(&awsstepfunctions.RetryProps{
		Errors:      jsii.Strings(terminateRetryErrors...),
		Interval:    sec(1),
		BackoffRate: jsii.Number(2),
		MaxAttempts: jsii.Number(4),
	})
	// An error the function returns is a fault of its own dependencies (e.g. DynamoDB), never a
	// business failure; every run is safe to repeat. (The emulator passes function errors on
	// as output, so this fires only on AWS.)
	task.AddRetry(&awsstepfunctions.RetryProps{
		Errors:      jsii.Strings("States.TaskFailed"),
		Interval:    sec(2),
		BackoffRate: jsii.Number(2),
		MaxAttempts: jsii.Number(3),
	})
}

// terminateNodePayload builds a round's task (stepfn.Task) from the state, which is the
// first step's input, or a round step's (from the queue):
// {reclaimId, nodeId, vmIds, executionArn, attempt, round, maxRounds, retryWaitSeconds}.
//
// executionArn is $$.Execution.Id, except in env local: the offline emulator only knows
// $$.Map.Item.* (and fails the state on $$.Execution.Id), so there it is LocalExecutionArn.
// The definitions of the two otherwise do not differ.
func (s *CapacityStack) terminateNodePayload(rounds, retryWait float64) *map[string]any {
	executionArn := awsstepfunctions.JsonPath_ExecutionId()
	if s.Env == LocalEnv {
		executionArn = jsii.String(LocalExecutionArn)
	}
	return &map[string]any{
		"reclaimId":    awsstepfunctions.JsonPath_StringAt(jsii.String("$.reclaimId")),
		"nodeId":       awsstepfunctions.JsonPath_StringAt(jsii.String("$.nodeId")),
		"vmIds":        awsstepfunctions.JsonPath_ListAt(jsii.String("$.vmIds")),
		"executionArn": executionArn,
		"attempt":      awsstepfunctions.JsonPath_NumberAt(jsii.String("$.attempt")),
		"round":        awsstepfunctions.JsonPath_NumberAt(jsii.String("$.round")),
		"maxRounds":    rounds,
		// When the next round may run, which the output's dueAt says.
		"retryWaitSeconds": retryWait,
	}
}

// notifyAgents is the task that sends the agents' eviction notices before the grace period,
// on terminate-node (the one function that may open the nodes' agent keys). It must never
// make the termination wait beyond the grace: the function cuts its calls off at
// terminateAfter, the task has no retries (a retry would come late) and a short timeout, and
// every error is caught and goes on to next, as success does. What became of each notice is
// recorded on the operation by the function.
func (s *CapacityStack) notifyAgents(c constructs.Construct, fn awslambda.IFunction, next awsstepfunctions.IChainable) awsstepfunctionstasks.LambdaInvoke {
	payload := map[string]any{"agentNotices": true}
	for k, v := range *s.terminateNodePayload(1, 0) {
		if k != "maxRounds" && k != "round" && k != "vmIds" && k != "retryWaitSeconds" {
			payload[k] = v
		}
	}
	t := awsstepfunctionstasks.NewLambdaInvoke(c, jsii.String("NotifyAgents"), &awsstepfunctionstasks.LambdaInvokeProps{
		StateName:                jsii.String("NotifyAgents"),
		LambdaFunction:           fn,
		Payload:                  awsstepfunctions.TaskInput_FromObject(&payload),
		ResultPath:               awsstepfunctions.JsonPath_DISCARD(),
		RetryOnServiceExceptions: jsii.Bool(false),
		// Above the function's own notice budget (40 s), below its 60 s timeout.
		TaskTimeout: awsstepfunctions.Timeout_Duration(awscdk.Duration_Seconds(jsii.Number(50))),
	})
	t.AddCatch(next, &awsstepfunctions.CatchProps{Errors: jsii.Strings("States.ALL"), ResultPath: awsstepfunctions.JsonPath_DISCARD()})
	return t
}
