#!/bin/sh
# Install what tests/workflow/test_slurm.py needs for its one-node SLURM cluster: Debian slurm-wlm (slurmctld, slurmd,
# sbatch, srun, squeue) and munge. Idempotent; root only (apt-get). The test itself starts and stops the
# daemons (tests/workflow/slurm_cluster.py), so nothing is started here.
set -eu

have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }

if have sbatch && have srun && have slurmctld && have slurmd && have munged && have mungekey; then
    echo "slurm-deps: slurm-wlm $(dpkg-query -W -f='${Version}' slurm-wlm 2>/dev/null) and munge already installed"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "slurm-deps: installing slurm-wlm and munge needs root (apt-get)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# policy-rc.d 101: the packages' maintainer scripts must not start system daemons of their own
had_policy=0
[ -e /usr/sbin/policy-rc.d ] && had_policy=1
[ "$had_policy" -eq 1 ] || printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
chmod +x /usr/sbin/policy-rc.d
status=0
apt-get install -y -qq --no-install-recommends slurm-wlm munge || status=$?
[ "$had_policy" -eq 1 ] || rm -f /usr/sbin/policy-rc.d
[ "$status" -eq 0 ] || exit "$status"
echo "slurm-deps: installed slurm-wlm $(dpkg-query -W -f='${Version}' slurm-wlm)"
