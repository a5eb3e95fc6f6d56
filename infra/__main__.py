"""`pulumi up` enters here: read the stack config once, then build the cloud, platform and workload layers."""

from trainyard import program

program.main()
