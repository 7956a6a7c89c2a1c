"""The fabric as built, against the fabric as planned.

ibnetdiscover  a streaming reader of `ibnetdiscover` topology output (InfiniBand)
lldp           `lldpctl -f json` output of hosts and switches (RoCE)
graph          the neutral discovered graph both readers produce
discover       tiers, hosts, bundles and anomalies of a dump, without a plan
match/verify   the dump against the plan's cabling (cabling_rows): one finding per fault
fabrictest     bandwidth-test pairs, thresholds from the plan, localisation of slow results

The plan's own fabric files (the ibdiagnet topology file, the switches' lossless QoS) are rendered by
gpucluster.render (ibtopo, switch) with every other generated file; `gpucluster fabric topofile` and
`switch-config` write them alone.
"""
