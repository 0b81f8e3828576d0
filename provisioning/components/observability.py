"""In the cluster (application layer): kube-prometheus-stack, the Prometheus rules generated
by slo/ as a PrometheusRule, and the monitors that scrape the control plane. In AWS (platform
layer): CloudWatch alarms on RDS and S3 and one composite alarm for AWS FIS experiment stop
conditions."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from provisioning.components.common import (
    MONITORING_NAMESPACE,
    POOL_LABEL,
    PROMETHEUS_RELEASE,
    TYPE_PREFIX,
    DataClass,
    Naming,
    child,
)
from provisioning.objectives import AlarmWindow

PROMETHEUS_STACK_VERSION = "75.15.1"
# Prometheus loads rules and monitors with this label: set explicitly as its selectors below,
# not left to the chart's default (which follows the release name).
RULE_LABEL = {"release": PROMETHEUS_RELEASE}
# Container/Service port name that serves /metrics on every control-plane pod (controlplane.py).
METRICS_PORT_NAME = "http"


class Observability(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        naming: Naming,
        rules: dict[str, Any],
        namespace: str,
        scraped_components: list[str],
        install_prometheus_stack: bool,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(f"{TYPE_PREFIX}:Observability", name, None, opts)
        depends: list[pulumi.Resource] = []
        if install_prometheus_stack:
            depends.append(self._prometheus_stack(name, naming))
        k8s.apiextensions.CustomResource(
            f"{name}-slo-rules",
            api_version="monitoring.coreos.com/v1",
            kind="PrometheusRule",
            metadata={"name": "slo-rules", "namespace": namespace,
                      "labels": {**naming.labels("slo-rules"), **RULE_LABEL}},
            spec={"groups": rules["groups"]},
            opts=child(self, depends_on=depends),
        )
        self._scrape_control_plane(name, naming, namespace, scraped_components, depends)
        self.register_outputs({})

    def _prometheus_stack(self, name: str, naming: Naming) -> pulumi.Resource:
        """kube-prometheus-stack as a Helm *release*: its operator's admission certificate is
        made by pre-install hook Jobs, which helm.v4.Chart never runs. Named exactly
        PROMETHEUS_RELEASE, so the Service is what PROMETHEUS_URL says."""
        ns = k8s.core.v1.Namespace(
            f"{name}-ns-{MONITORING_NAMESPACE}",
            metadata={"name": MONITORING_NAMESPACE, "labels": naming.labels("monitoring")},
            opts=child(self))
        selector = {"matchLabels": RULE_LABEL}
        return k8s.helm.v3.Release(
            f"{name}-prometheus-stack",
            name=PROMETHEUS_RELEASE,
            chart="kube-prometheus-stack",
            version=PROMETHEUS_STACK_VERSION,
            namespace=MONITORING_NAMESPACE,
            repository_opts=k8s.helm.v3.RepositoryOptsArgs(
                repo="https://prometheus-community.github.io/helm-charts"),
            values={"prometheus": {"prometheusSpec": {
                "nodeSelector": {POOL_LABEL: "system"},
                "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
                "ruleSelector": selector, "serviceMonitorSelector": selector,
                "podMonitorSelector": selector,
                # {} = every namespace: the monitors live in the control plane's namespace
                "ruleNamespaceSelector": {}, "serviceMonitorNamespaceSelector": {},
                "podMonitorNamespaceSelector": {}}}},
            opts=child(self, depends_on=[ns]),
        )

    def _scrape_control_plane(self, name: str, naming: Naming, namespace: str,
                              pod_components: list[str], depends: list[pulumi.Resource]) -> None:
        """The API through its Service, the reconciler and agents through their pods (they
        have no Service): without these the SLO rules have no input."""
        k8s.apiextensions.CustomResource(
            f"{name}-api-monitor",
            api_version="monitoring.coreos.com/v1",
            kind="ServiceMonitor",
            metadata={"name": "controlplane-api", "namespace": namespace,
                      "labels": {**naming.labels("api-monitor"), **RULE_LABEL}},
            spec={"selector": {"matchLabels": {"app.kubernetes.io/component": "api",
                                               "app.kubernetes.io/part-of": naming.project}},
                  "endpoints": [{"port": METRICS_PORT_NAME, "path": "/metrics",
                                 "interval": "15s"}]},
            opts=child(self, depends_on=depends),
        )
        k8s.apiextensions.CustomResource(
            f"{name}-pod-monitor",
            api_version="monitoring.coreos.com/v1",
            kind="PodMonitor",
            metadata={"name": "controlplane", "namespace": namespace,
                      "labels": {**naming.labels("pod-monitor"), **RULE_LABEL}},
            spec={"selector": {"matchLabels": {"app.kubernetes.io/name": "controlplane"},
                               "matchExpressions": [{"key": "app.kubernetes.io/component",
                                                     "operator": "In",
                                                     "values": pod_components}]},
                  "podMetricsEndpoints": [{"port": METRICS_PORT_NAME, "path": "/metrics",
                                           "interval": "15s"}]},
            opts=child(self, depends_on=depends),
        )


class Alarms(pulumi.ComponentResource):
    """CloudWatch alarms on the database and the artifact buckets, their SNS topic, and the
    composite alarm AWS FIS experiments use as their stop condition."""

    alarm_topic_arn: pulumi.Output[str]
    fis_stop_alarm_arn: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        naming: Naming,
        db_identifier: str,
        db_window: AlarmWindow,
        allocated_storage_gb: int,
        bucket_name: pulumi.Input[str],
        artifacts_window: AlarmWindow,
        replica_bucket_name: pulumi.Input[str] | None,
        kms_key_arn: pulumi.Input[str],
        alarm_email: str | None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(f"{TYPE_PREFIX}:Alarms", name, None, opts)
        topic = aws.sns.Topic(f"{name}-alarms", kms_master_key_id=kms_key_arn,
                              tags=naming.tags(f"{name}-alarms", DataClass.TELEMETRY), opts=child(self))
        if alarm_email:
            aws.sns.TopicSubscription(f"{name}-alarms-email", topic=topic.arn, protocol="email",
                                      endpoint=alarm_email, opts=child(self))
        rds = {"DBInstanceIdentifier": db_identifier}
        s3 = {"BucketName": bucket_name, "FilterId": "EntireBucket"}
        specs: list[tuple[str, str, str, dict[str, Any], str, float, AlarmWindow, str]] = [
            ("rds-cpu", "AWS/RDS", "CPUUtilization", rds, "GreaterThanThreshold", 90, db_window, "Average"),
            ("rds-free-storage", "AWS/RDS", "FreeStorageSpace", rds, "LessThanThreshold",
             allocated_storage_gb * 1024**3 * 0.1, db_window, "Minimum"),
            ("rds-write-latency", "AWS/RDS", "WriteLatency", rds, "GreaterThanThreshold", 0.05, db_window, "Average"),
            ("rds-connections-zero", "AWS/RDS", "DatabaseConnections", rds, "LessThanThreshold", 1,
             db_window, "Maximum"),
            ("s3-5xx", "AWS/S3", "5xxErrors", s3, "GreaterThanThreshold", 0, artifacts_window, "Sum"),
        ]
        if replica_bucket_name is not None:
            # Replication metrics are published per source, destination and rule: an alarm
            # without all three matches no datapoint.
            specs.append(("s3-replication-failed", "AWS/S3", "OperationsFailedReplication",
                          {"SourceBucket": bucket_name, "DestinationBucket": replica_bucket_name,
                           "RuleId": "all-objects"}, "GreaterThanThreshold",
                          0, artifacts_window, "Sum"))
        alarms: list[aws.cloudwatch.MetricAlarm] = []
        for key, ns, metric, dims, op, threshold, window, stat in specs:
            alarms.append(aws.cloudwatch.MetricAlarm(
                f"{name}-{key}",
                name=naming.name(key),
                namespace=ns, metric_name=metric, dimensions=dims,
                comparison_operator=op, threshold=threshold, statistic=stat,
                # Window derived from the failure class's RTO (provisioning.objectives.derive_alarm_window).
                period=window.period_seconds, evaluation_periods=window.evaluation_periods,
                # Missing data is never an outage here: before the application layer is
                # deployed nothing connects, and a breaching default held the FIS stop
                # condition in ALARM (the FIS experiments could not start).
                treat_missing_data="notBreaching",
                alarm_actions=[topic.arn], ok_actions=[topic.arn],
                tags=naming.tags(naming.name(key), DataClass.TELEMETRY),
                opts=child(self),
            ))
        # FIS experiments stop when anything beyond the injected fault breaks.
        stop = aws.cloudwatch.CompositeAlarm(
            f"{name}-fis-stop",
            alarm_name=naming.name("fis-stop-condition"),
            alarm_rule=pulumi.Output.all(*[a.name for a in alarms]).apply(
                lambda names: " OR ".join(f'ALARM("{n}")' for n in names)),
            alarm_actions=[topic.arn],
            tags=naming.tags(naming.name("fis-stop-condition"), DataClass.TELEMETRY),
            opts=child(self),
        )
        self.alarm_topic_arn = topic.arn
        self.fis_stop_alarm_arn = stop.arn
        self.register_outputs({"alarm_topic_arn": topic.arn, "fis_stop_alarm_arn": stop.arn})
