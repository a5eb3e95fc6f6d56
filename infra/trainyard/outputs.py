"""Stack output keys, shared by the program, the plan and the acceptance tests."""

KUBECONFIG = "kubeconfig"
CLUSTER_NAME = "clusterName"
DATASET_BUCKET = "datasetBucket"
CHECKPOINT_BUCKET = "checkpointBucket"
