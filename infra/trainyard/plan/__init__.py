"""The offline plan: the real program under Pulumi's mock runtime, recorded resource by resource."""
