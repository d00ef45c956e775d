package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigateway"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatchactions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awskms"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssns"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssnssubscriptions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssqs"
	"github.com/aws/aws-cdk-go/awscdk/v2/interfaces/interfacesawscloudwatch"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"

	"github.com/openrelay/capacity/shared/emf"
	"github.com/openrelay/capacity/shared/stackname"
)

// MetricsNamespace is the namespace of the service's embedded-metric-format metrics; each has
// the dimension emf.DimensionEnvironment = the function's APP_ENV.
const MetricsNamespace = emf.Namespace

// Default thresholds of the API alarms, overridable per environment (cdk.json "alarms").
const (
	DefaultAlarmApiErrorRate = 0.05 // API Gateway 5XXError Average is the fraction of requests answered 5xx
	DefaultAlarmApiP99Millis = 3000
)

// alarmEvaluateEvery is the period, in minutes, of the alarms on counts.
const alarmEvaluateEvery = 5

// accessLogFields are the API stage's JSON access log record: key -> API Gateway $context variable.
func accessLogFields() map[string]*string {
	return map[string]*string{
		"requestId":          awsapigateway.AccessLogField_ContextRequestId(),
		"extendedRequestId":  awsapigateway.AccessLogField_ContextExtendedRequestId(),
		"xrayTraceId":        awsapigateway.AccessLogField_ContextXrayTraceId(),
		"ip":                 awsapigateway.AccessLogField_ContextIdentitySourceIp(),
		"caller":             awsapigateway.AccessLogField_ContextIdentityCaller(),
		"userAgent":          awsapigateway.AccessLogField_ContextIdentityUserAgent(),
		"httpMethod":         awsapigateway.AccessLogField_ContextHttpMethod(),
		"resourcePath":       awsapigateway.AccessLogField_ContextResourcePath(),
		"path":               awsapigateway.AccessLogField_ContextPath(),
		"status":             awsapigateway.AccessLogField_ContextStatus(),
		"protocol":           awsapigateway.AccessLogField_ContextProtocol(),
		"responseLength":     awsapigateway.AccessLogField_ContextResponseLength(),
		"requestTime":        awsapigateway.AccessLogField_ContextRequestTime(),
		"responseLatency":    awsapigateway.AccessLogField_ContextResponseLatency(),
		"integrationLatency": awsapigateway.AccessLogField_ContextIntegrationLatency(),
		"integrationStatus":  awsapigateway.AccessLogField_ContextIntegrationStatus(),
		"errorMessage":       awsapigateway.AccessLogField_ContextErrorMessage(),
	}
}

// accessLogFormat is accessLogFields as one JSON object per request. The helpers quote string
// variables and leave numbers bare, so each record is valid JSON.
func accessLogFormat() awsapigateway.AccessLogFormat {
	b, err := json.Marshal(accessLogFields())
	if err != nil {
		panic(fmt.Sprintf("access log format: %v", err))
	}
	return awsapigateway.AccessLogFormat_Custom(jsii.String(string(b)))
}

type namedFunction struct {
	name string
	fn   awslambda.Function
}

// functions are the stack's Lambda functions by name (the floor only in env local).
func (s *CapacityStack) functions() []namedFunction {
	fns := []namedFunction{{"api", s.ApiFunction}, {"terminate-node", s.TerminateNodeFunction}, {"reconciler", s.ReconcilerFunction},
		{"reclaim-events", s.ReclaimEventsFunction}, {"operation-events", s.OperationEventsFunction},
		{"termination-steps", s.TerminationStepsFunction}}
	if s.FloorFunction != nil {
		fns = append(fns, namedFunction{"floor", s.FloorFunction})
	}
	return fns
}

// newMonitoring creates the alarm topic, every alarm and the dashboard.
func (s *CapacityStack) newMonitoring() {
	s.AlarmTopic = s.newAlarmTopic()
	s.alarmScope = constructs.NewConstruct(s.Stack, jsii.String("Alarms"))
	s.newAlarms()
	s.Dashboard = s.newDashboard()
}

// newAlarmTopic creates "capacity-<env>-alarms", encrypted with a key of its own (the AWS
// managed SNS key does not let CloudWatch publish) and TLS only, subscribed by the configured
// address or endpoint, if any.
func (s *CapacityStack) newAlarmTopic() awssns.Topic {
	name := stackname.Resource(s.Env, "alarms")
	c := constructs.NewConstruct(s.Stack, jsii.String("Alarming"))
	key := awskms.NewKey(c, jsii.String("TopicKey"), &awskms.KeyProps{
		Alias:             jsii.String("alias/" + name),
		Description:       jsii.String("Encrypts the alarm topic " + name),
		EnableKeyRotation: jsii.Bool(true),
		RemovalPolicy:     s.removalPolicy(),
	})
	// CloudWatch encrypts what it publishes to the topic with this key.
	key.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String("CloudWatchAlarmsPublish"),
		Principals: &[]awsiam.IPrincipal{awsiam.NewServicePrincipal(jsii.String("cloudwatch.amazonaws.com"), nil)},
		Actions:    jsii.Strings("kms:GenerateDataKey*", "kms:Decrypt"),
		Resources:  jsii.Strings("*"),
		Conditions: &map[string]any{"StringEquals": map[string]any{"aws:SourceAccount": awscdk.Aws_ACCOUNT_ID()}},
	}), nil)
	topic := awssns.NewTopic(c, jsii.String("Topic"), &awssns.TopicProps{
		TopicName:   jsii.String(name),
		DisplayName: jsii.String("capacity " + s.Env + " alarms"),
		MasterKey:   key,
		EnforceSSL:  jsii.Bool(true),
	})
	// The topic policy replaces SNS's default one: let this account's alarms publish.
	topic.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String("CloudWatchAlarmsPublish"),
		Principals: &[]awsiam.IPrincipal{awsiam.NewServicePrincipal(jsii.String("cloudwatch.amazonaws.com"), nil)},
		Actions:    jsii.Strings("sns:Publish"),
		Resources:  &[]*string{topic.TopicArn()},
		Conditions: &map[string]any{"StringEquals": map[string]any{"aws:SourceAccount": awscdk.Aws_ACCOUNT_ID()}},
	}))
	switch sub := s.AlarmSubscription; {
	case sub == "":
	case strings.HasPrefix(sub, "https://"):
		topic.AddSubscription(awssnssubscriptions.NewUrlSubscription(jsii.String(sub), &awssnssubscriptions.UrlSubscriptionProps{
			Protocol: awssns.SubscriptionProtocol_HTTPS,
		}))
	default: // an email address (validated in config.go)
		topic.AddSubscription(awssnssubscriptions.NewEmailSubscription(jsii.String(sub), nil))
	}
	return topic
}

// alarm creates the alarm "capacity-<env>-<what>" on metric (whose period and statistic it
// carries): ALARM and OK notify the alarm topic; no data is not a breach.
func (s *CapacityStack) alarm(what, todo string, metric awscloudwatch.IMetric, op awscloudwatch.ComparisonOperator,
	threshold, periods, datapoints float64) awscloudwatch.Alarm {
	a := awscloudwatch.NewAlarm(s.alarmScope, jsii.String(constructID(what)), &awscloudwatch.AlarmProps{
		AlarmName:          jsii.String(stackname.Resource(s.Env, what)),
		AlarmDescription:   jsii.String(todo),
		Metric:             metric,
		ComparisonOperator: op,
		Threshold:          jsii.Number(threshold),
		EvaluationPeriods:  jsii.Number(periods),
		DatapointsToAlarm:  jsii.Number(datapoints),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})
	action := awscloudwatchactions.NewSnsAction(s.AlarmTopic)
	a.AddAlarmAction(action)
	a.AddOkAction(action)
	s.Alarms[what] = a
	return a
}

// atLeastOnce alarms when metric (a count) reaches 1 in a period.
func (s *CapacityStack) atLeastOnce(what, todo string, metric awscloudwatch.IMetric) awscloudwatch.Alarm {
	return s.alarm(what, todo, metric, awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD, 1, 1, 1)
}

// serviceMetric is one of the service's EMF metrics (see MetricsNamespace).
func (s *CapacityStack) serviceMetric(name, statistic string, minutes float64) awscloudwatch.Metric {
	return awscloudwatch.NewMetric(&awscloudwatch.MetricProps{
		Namespace:     jsii.String(MetricsNamespace),
		MetricName:    jsii.String(name),
		DimensionsMap: &map[string]*string{emf.DimensionEnvironment: jsii.String(s.Env)},
		Statistic:     jsii.String(statistic),
		Period:        awscdk.Duration_Minutes(jsii.Number(minutes)),
	})
}

func every(minutes float64, statistic string) *awscloudwatch.MetricOptions {
	return &awscloudwatch.MetricOptions{Period: awscdk.Duration_Minutes(jsii.Number(minutes)), Statistic: jsii.String(statistic)}
}

// newAlarms creates every alarm of the environment (s.Alarms, by what).
func (s *CapacityStack) newAlarms() {
	stage := s.Api.DeploymentStage()
	s.alarm("api-5xx-rate",
		fmt.Sprintf("More than %g%% of API requests answered 5xx (3 of 5 minutes). Look at the api function's errors "+
			"and logs (problem code internal or throttled) and the API access logs (integrationStatus, errorMessage).", s.alarmApi.errorRate*100),
		stage.MetricServerError(every(1, "Average")), awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD, s.alarmApi.errorRate, 5, 3)
	s.alarm("api-p99-latency",
		fmt.Sprintf("API p99 latency above %g ms (2 of 3 five-minute periods). Compare responseLatency with integrationLatency "+
			"in the access logs, and look at X-Ray traces for slow DynamoDB or Step Functions calls.", s.alarmApi.p99Millis),
		stage.MetricLatency(every(5, "p99")), awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD, s.alarmApi.p99Millis, 3, 2)
	for _, f := range s.functions() {
		s.atLeastOnce(f.name+"-errors",
			"The "+f.name+" function failed (error or timeout) in the last 5 minutes. Look at its log group /aws/lambda/"+
				stackname.Function(s.Env, f.name)+" (level ERROR, by trace_id) and its X-Ray traces.",
			f.fn.MetricErrors(every(alarmEvaluateEvery, "Sum")))
		s.atLeastOnce(f.name+"-throttles",
			"The "+f.name+" function was throttled in the last 5 minutes: the account's or the function's concurrency is exhausted. "+
				"Check the account's Lambda concurrency and what else runs in it.",
			f.fn.MetricThrottles(every(alarmEvaluateEvery, "Sum")))
	}
	s.atLeastOnce("termination-failed",
		"A termination workflow execution failed. Open it in the Step Functions console (full history in /aws/vendedlogs/states/"+
			stackname.Resource(s.Env, "termination-express")+"); the reconciler restarts its operation, and the operation's item says which VMs are left.",
		s.Termination.MetricFailed(every(alarmEvaluateEvery, "Sum")))
	s.atLeastOnce("termination-timed-out",
		"A termination workflow execution timed out (1 hour). Open it in the Step Functions console; a node agent is probably "+
			"unreachable or slow. The reconciler restarts its operation.",
		s.Termination.MetricTimedOut(every(alarmEvaluateEvery, "Sum")))
	s.atLeastOnce("stuck-reclaims",
		"The reconciler found reclaim operations stuck (started, not ended, past STUCK_AFTER). Look at the reconciler's logs and the "+
			"operations' executions; their VMs are still running.",
		s.serviceMetric(emf.MetricStuckReclaimOperations, "Maximum", 5))
	s.atLeastOnce("held-reclaims",
		"The reconciler found failed reclaim operations that have held VMs terminating (and their units unusable) for over HELD_AFTER "+
			"(1 hour). Its ERROR log lines name each operation, node and VM. Re-drive the operation (POST .../reclaims/{reclaimId}/retry); "+
			"if the node's agent can never answer and the VM is confirmed gone out of band, force-end it (POST .../vms/{vmId}/force-end).",
		s.serviceMetric(emf.MetricHeldReclaimOperations, "Maximum", 5))
	s.atLeastOnce("reclaim-restarts",
		"The reconciler restarted reclaim operations whose workflow had ended without finishing them in the last 15 minutes. Look at "+
			"the failed or aborted executions and terminate-node's logs.",
		s.serviceMetric(emf.MetricRestartedReclaimOperations, "Sum", 15))
	s.atLeastOnce("reclaim-starts-exhausted",
		"The reconciler gave up starting the workflow of reclaim operations (attempts exhausted): their VMs are not being terminated. "+
			"Look at the reconciler's logs (StartExecution errors) and fail or re-drive the operations.",
		s.serviceMetric(emf.MetricReclaimStartsExhausted, "Sum", 5))
	// The limiter fails open (a call goes on unchecked when its bucket's write fails), so a
	// key hammering its own bucket into throttling would go unlimited unseen. A blip lets a
	// few calls through; a run of them is the limiter down.
	s.alarm("rate-limit-unchecked",
		fmt.Sprintf("At least %d API calls in 5 minutes went through without their key's rate limit checked (the limits table write "+
			"failed: throttled, timed out or refused). See docs/operating.md, \"When the rate limit is not checked\".", rateUncheckedAlarmCalls),
		s.serviceMetric(emf.MetricRateLimitUnchecked, "Sum", alarmEvaluateEvery),
		awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD, rateUncheckedAlarmCalls, 1, 1)
	s.atLeastOnce("intake-records-refused",
		"reclaim-events refused records the intake queue did not hand out (their receipt handle is not one it holds): "+
			"something invoked the function directly. Its ERROR log lines ('not received from the intake queue') name each "+
			"message; CloudTrail's Lambda data events (Invoke), where enabled, say who.",
		s.serviceMetric(emf.MetricIntakeRecordsRefused, "Sum", alarmEvaluateEvery))
	s.alarmOnDeadLetters(s.ReclaimRequestsDeadLetters, "reclaim-requests")
	// A step dead-lettered is a round that never ran: its operation makes no progress (the
	// reconciler runs it as the next attempt), and the message says which.
	s.alarmOnDeadLetters(s.TerminationStepsDeadLetters, "termination-steps")
	// A stalled consumer fills no dead-letter queue either: its rounds just wait. No step is
	// held back longer than the longest delay (the retry wait, at most 900 s) and a few tries.
	s.alarm("termination-steps-age",
		fmt.Sprintf("A termination step has waited more than %d minutes in capacity-%s-termination-steps: termination-steps is not "+
			"running the rounds, so VMs are not being terminated. Check the function's SQS trigger (enabled?), its errors and throttles, and its logs.",
			terminationStepMaxAgeSeconds/60, s.Env),
		s.TerminationSteps.MetricApproximateAgeOfOldestMessage(every(alarmEvaluateEvery, "Maximum")),
		awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD, terminationStepMaxAgeSeconds, 1, 1)
	// A stalled consumer (event source mapping disabled, function unable to start) fills no
	// dead-letter queue: its requests just wait. With 5 tries 6 minutes apart, a request
	// being retried is at most about half an hour old.
	s.alarm("reclaim-requests-age",
		fmt.Sprintf("A reclaim request has waited more than %d minutes in capacity-%s-reclaim-requests: reclaim-events is not "+
			"consuming it. Check the function's SQS trigger (enabled?), its errors and throttles, and its logs.", reclaimRequestMaxAgeSeconds/60, s.Env),
		s.ReclaimRequests.MetricApproximateAgeOfOldestMessage(every(alarmEvaluateEvery, "Maximum")),
		awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD, reclaimRequestMaxAgeSeconds, 1, 1)
}

// rateUncheckedAlarmCalls is how many calls let through unchecked in 5 minutes alarm.
const rateUncheckedAlarmCalls = 10

// terminationStepMaxAgeSeconds is the age of the oldest queued termination step that alarms.
const terminationStepMaxAgeSeconds = 20 * 60

// reclaimRequestMaxAgeSeconds is the age of the oldest queued reclaim request that alarms.
const reclaimRequestMaxAgeSeconds = 45 * 60

// alarmOnDeadLetters alarms as soon as a dead-letter queue holds a message.
func (s *CapacityStack) alarmOnDeadLetters(q awssqs.IQueue, what string) awscloudwatch.Alarm {
	return s.atLeastOnce(what+"-dead-letters",
		"Messages reached the dead-letter queue of "+what+": they failed every retry. Read them (their payload and the "+
			"matching error logs), fix the cause, then re-drive them.",
		q.MetricApproximateNumberOfMessagesVisible(every(alarmEvaluateEvery, "Maximum")))
}

// newDashboard creates the dashboard "capacity-<env>": the API, the service's metrics, the
// functions, the workflow, the reconciler, the reclaim request queues, and every alarm's state.
func (s *CapacityStack) newDashboard() awscloudwatch.Dashboard {
	stage := s.Api.DeploymentStage()
	m := func(metrics ...awscloudwatch.IMetric) *[]awscloudwatch.IMetric { return &metrics }
	graph := func(title string, width float64, left ...awscloudwatch.IMetric) awscloudwatch.IWidget {
		return awscloudwatch.NewGraphWidget(&awscloudwatch.GraphWidgetProps{Title: jsii.String(title), Width: jsii.Number(width), Left: m(left...)})
	}
	label := func(metric awscloudwatch.Metric, l string) awscloudwatch.IMetric {
		return metric.With(&awscloudwatch.MetricOptions{Label: jsii.String(l)})
	}
	sum := func(name string) awscloudwatch.IMetric { return label(s.serviceMetric(name, "Sum", 5), name) }
	maximum := func(name string) awscloudwatch.IMetric { return label(s.serviceMetric(name, "Maximum", 5), name) }

	var fnErrors, fnThrottles, fnDuration []awscloudwatch.IMetric
	for _, f := range s.functions() {
		fnErrors = append(fnErrors, label(f.fn.MetricErrors(every(5, "Sum")), f.name))
		fnThrottles = append(fnThrottles, label(f.fn.MetricThrottles(every(5, "Sum")), f.name))
		fnDuration = append(fnDuration, label(f.fn.MetricDuration(every(5, "p99")), f.name+" p99"))
	}
	alarms := make([]interfacesawscloudwatch.IAlarmRef, 0, len(s.Alarms))
	for _, what := range sortedKeys(s.Alarms) {
		alarms = append(alarms, s.Alarms[what])
	}
	refusals := awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
		Expression: jsii.String(`SEARCH('{` + MetricsNamespace + `,` + emf.DimensionAction + `,` + emf.DimensionCode + `,` + emf.DimensionEnvironment +
			`} MetricName="` + emf.MetricRefusals + `" ` + emf.DimensionEnvironment + `="` + s.Env + `"', 'Sum', 300)`),
		Label:  jsii.String("Refusals"),
		Period: awscdk.Duration_Minutes(jsii.Number(5)),
	})

	return awscloudwatch.NewDashboard(s.Stack, jsii.String("Dashboard"), &awscloudwatch.DashboardProps{
		DashboardName: jsii.String(stackname.Stack(s.Env)),
		Widgets: &[]*[]awscloudwatch.IWidget{
			{
				graph("API requests", 8, label(stage.MetricCount(every(1, "Sum")), "requests")),
				graph("API 4xx / 5xx", 8, label(stage.MetricClientError(every(1, "Sum")), "4xx"), label(stage.MetricServerError(every(1, "Sum")), "5xx")),
				graph("API latency", 8, label(stage.MetricLatency(every(5, "p50")), "p50"), label(stage.MetricLatency(every(5, "p99")), "p99")),
			},
			{
				graph("Reclaims", 8, sum(emf.MetricReclaims), sum(emf.MetricReclaimVictims), sum(emf.MetricReclaimDryRuns)),
				graph("Refusals by action and code", 8, refusals),
				graph("Reclaim to last termination", 8,
					label(s.serviceMetric(emf.MetricReclaimTerminationTime, "p50", 5), "p50"), label(s.serviceMetric(emf.MetricReclaimTerminationTime, "p99", 5), "p99")),
			},
			{
				graph("Function errors", 8, fnErrors...),
				graph("Function throttles", 8, fnThrottles...),
				graph("Function duration", 8, fnDuration...),
			},
			{
				graph("Termination executions", 12,
					label(s.Termination.MetricStarted(every(5, "Sum")), "started"), label(s.Termination.MetricSucceeded(every(5, "Sum")), "succeeded"),
					label(s.Termination.MetricFailed(every(5, "Sum")), "failed"), label(s.Termination.MetricTimedOut(every(5, "Sum")), "timed out")),
				graph("Reconciler", 12, sum(emf.MetricStartedReclaimOperations), sum(emf.MetricRestartedReclaimOperations), sum(emf.MetricStartFailedReclaimOperations),
					sum(emf.MetricEndedByReconciler), sum(emf.MetricReportedByReconciler), sum(emf.MetricReclaimStartsExhausted), maximum(emf.MetricStuckReclaimOperations),
					maximum(emf.MetricHeldReclaimOperations), maximum(emf.MetricHeldVMs)),
			},
			{
				graph("Reclaim requests (queue)", 12,
					label(s.ReclaimRequests.MetricApproximateNumberOfMessagesVisible(every(1, "Maximum")), "visible"),
					label(s.ReclaimRequests.MetricApproximateNumberOfMessagesNotVisible(every(1, "Maximum")), "in flight"),
					label(s.ReclaimRequestsDeadLetters.MetricApproximateNumberOfMessagesVisible(every(1, "Maximum")), "dead letters")),
				graph("Oldest reclaim request (s)", 12,
					label(s.ReclaimRequests.MetricApproximateAgeOfOldestMessage(every(1, "Maximum")), "queue"),
					label(s.ReclaimRequestsDeadLetters.MetricApproximateAgeOfOldestMessage(every(1, "Maximum")), "dead letters")),
			},
			{
				awscloudwatch.NewAlarmStatusWidget(&awscloudwatch.AlarmStatusWidgetProps{
					Title: jsii.String("Alarms"), Width: jsii.Number(24), Alarms: &alarms,
				}),
			},
		},
	})
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
