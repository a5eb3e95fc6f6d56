"""Cloud layer: the AWS half of `pulumi up` (or the kubeconfig hand-over for the local stack)."""
