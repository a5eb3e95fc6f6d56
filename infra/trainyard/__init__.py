"""trainyard: a Pulumi program that bootstraps a GPU training platform on AWS EKS."""
