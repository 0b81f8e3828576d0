"""What the provisioned deploy runner (provisioning/components/deploy_runner.py) and the operator's
`gameday infra image|deploy` (operations/deploy.py) agree on: the images built and where uploaded
sources go. Its own module so the Pulumi program never imports the operator's tools."""

# Dockerfile targets, each pushed to the ECR repository of the same name (provisioning/buildspecs/image.yml)
IMAGE_TARGETS = ("controlplane", "gameday")
SOURCE_PREFIX = "source/"  # key prefix of the uploaded source archives in the artifacts bucket
