"""An EKS authentication token from the caller's AWS credentials, without the `aws` CLI.

What `aws eks get-token` and aws-iam-authenticator do: a presigned STS GetCallerIdentity URL
that names the cluster in the signed ``x-k8s-aws-id`` header, base64url-encoded behind the
``k8s-aws-v1.`` prefix. EKS accepts it for 15 minutes; kubectl and the Pulumi Kubernetes
provider call the exec plugin again when it expires, so a long `pulumi up` keeps working.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Any

TOKEN_PREFIX = "k8s-aws-v1."
CLUSTER_HEADER = "x-k8s-aws-id"
# The presigned URL's own lifetime; EKS caps the token at 15 minutes whatever it says.
URL_EXPIRES_SECONDS = 60
# Reported to the client so it asks again before EKS would refuse the token.
TOKEN_LIFETIME = dt.timedelta(minutes=14)
EXEC_API_VERSION = "client.authentication.k8s.io/v1beta1"


class TokenError(Exception):
    pass


def eks_token(cluster_name: str, region: str, session: Any = None) -> str:
    import boto3
    from botocore.signers import RequestSigner

    session = session or boto3.session.Session(region_name=region)
    credentials = session.get_credentials()
    if credentials is None:
        raise TokenError("no AWS credentials found (environment, profile, or instance/role "
                         "credentials): an EKS token is signed with them")
    sts = session.client("sts", region_name=region)
    signer = RequestSigner(sts.meta.service_model.service_id, region, "sts", "v4",
                           credentials, session.events)
    url = signer.generate_presigned_url(
        {"method": "GET",
         "url": f"https://sts.{region}.amazonaws.com/?Action=GetCallerIdentity&Version=2011-06-15",
         "body": {}, "headers": {CLUSTER_HEADER: cluster_name}, "context": {}},
        region_name=region, expires_in=URL_EXPIRES_SECONDS, operation_name="")
    return TOKEN_PREFIX + base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")


def exec_credential(token: str, now: dt.datetime | None = None) -> dict[str, Any]:
    """The ExecCredential a kubeconfig ``exec`` plugin prints."""
    expires = (now or dt.datetime.now(dt.UTC)) + TOKEN_LIFETIME
    return {"kind": "ExecCredential", "apiVersion": EXEC_API_VERSION, "spec": {},
            "status": {"expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
                       "token": token}}


def kubeconfig(cluster_name: str, endpoint: str, ca_data: str, region: str) -> str:
    """A kubeconfig for the cluster whose credentials come from `gameday infra kube-token`
    (this package's console script), so neither the `aws` CLI nor a stored token is needed."""
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": cluster_name,
        "clusters": [{"name": cluster_name,
                      "cluster": {"server": endpoint, "certificate-authority-data": ca_data}}],
        "contexts": [{"name": cluster_name,
                      "context": {"cluster": cluster_name, "user": cluster_name}}],
        "users": [{"name": cluster_name, "user": {"exec": {
            "apiVersion": EXEC_API_VERSION, "command": "gameday",
            "args": ["infra", "kube-token", "--cluster", cluster_name, "--region", region],
            "interactiveMode": "Never"}}}],
    }, sort_keys=True)
