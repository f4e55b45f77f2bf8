//! Admission: what `vm.create` decides from a request alone, before any
//! KVM or file work: the guest shape and where its vCPUs go.
//!
//! WHAT: [`admit`] (the shape, then the placement: the request's
//! `cpus.affinity`, the planner's pinned placement on the CPUs still
//! free, or none) and `placement_name` (what `vm.info` reports).
//! WHY: a VM refused here costs nothing; every refusal names the field.
//! Clients that cannot ask for a policy (Kata, CH's own tools) get pinned
//! CPUs while there are free ones and share the CPUs after that, instead
//! of a refusal; `pinned` asked for keeps the strict rule.
//! HOW: pure functions over the host topology and the free-CPU map; the
//! `api_body` fuzz target drives [`admit`].

use topology::{GuestTopology, HostTopology};
use vcpu_sched::placement::pack::{FreeMap, Relax, VmPlan};

use super::api::{ApiError, VmConfig};

/// What `vm.create` decides from a request alone (no KVM, no I/O): the
/// guest shape, and its placement on `topo` (the given `cpus.affinity`,
/// or the planner's on the CPUs `free` has left, which it takes). An
/// error names the field at fault. The `api_body` fuzz target drives it.
pub fn admit(
    cfg: &VmConfig,
    id: &str,
    topo: &HostTopology,
    free: &mut FreeMap,
) -> Result<(String, Option<VmPlan>), ApiError> {
    let shape = cfg.guest_shape()?;
    let guest = GuestTopology::from_spec(&shape)
        .map_err(|e| ApiError::bad("cpus.topology", e.to_string()))?;
    let placement = cfg.x_vmm.as_ref().and_then(|x| x.placement.clone());
    let policy = placement.as_ref().map_or("pinned", |p| p.policy.as_str());
    let relax = placement.as_ref().map_or(Relax::default(), |p| p.relax);
    let plan = if let Some(aff) = &cfg.cpus.affinity {
        let plan = given_plan(aff, cfg.max_vcpus(), topo)?;
        free.set(&plan.dense, true);
        Some(plan)
    } else if policy == "pinned" {
        let label = format!("VM {id}");
        match vcpu_sched::placement::pack::place(topo, &guest, relax, free, &label) {
            Ok(p) => Some(p),
            // No policy asked for (what Kata and other CH clients send):
            // a guest that would fit the empty host but finds its CPUs
            // taken shares them, unpinned, instead of being refused. The
            // scheduler then places its vCPUs among the others'.
            Err(_) if placement.is_none() && fits_empty(topo, &guest, relax, &label) => {
                tracing::info!(
                    "{label}: no free CPUs for a pinned placement; its vCPUs share the host's CPUs (unpinned)"
                );
                None
            }
            Err(e) => return Err(ApiError::bad("cpus", e.0)),
        }
    } else {
        None
    };
    Ok((shape, plan))
}

/// Whether `guest` has a pinned placement on `topo` with every CPU free:
/// a guest refused only because other VMs hold the CPUs.
fn fits_empty(topo: &HostTopology, guest: &GuestTopology, relax: Relax, label: &str) -> bool {
    let mut all_free = FreeMap::new(topo);
    vcpu_sched::placement::pack::place(topo, guest, relax, &mut all_free, label).is_ok()
}

/// The placement a VM got, as `vm.info`'s `x_vmm.placement` names it:
/// `affinity` (the request's `cpus.affinity`), `pinned` (the planner's),
/// `none` (asked for), or `shared` (no policy asked for and no free CPUs
/// left when it was created: unpinned).
pub(crate) fn placement_name(cfg: &VmConfig, plan: Option<&VmPlan>) -> &'static str {
    let asked = cfg.x_vmm.as_ref().and_then(|x| x.placement.as_ref());
    match (plan, asked) {
        (Some(_), _) if cfg.cpus.affinity.is_some() => "affinity",
        (Some(_), _) => "pinned",
        (None, Some(_)) => "none",
        (None, None) => "shared",
    }
}

/// The placement `cpus.affinity` gives: one host CPU for each of the `n`
/// vCPUs, each in `topo`.
fn given_plan(
    aff: &[vcpu_sched::placement::pack::CpuAffinity],
    n: u32,
    topo: &HostTopology,
) -> Result<VmPlan, ApiError> {
    let mut dense = vec![u32::MAX; n as usize];
    let mut os = vec![u32::MAX; n as usize];
    for a in aff {
        if a.vcpu >= n {
            return Err(ApiError::bad(
                "cpus.affinity",
                format!("vcpu {} but the VM has {n} vCPUs", a.vcpu),
            ));
        }
        let [c] = a.host_cpus[..] else {
            return Err(ApiError::bad(
                "cpus.affinity",
                format!(
                    "vcpu {}: give exactly one host CPU per vCPU (pinned placement)",
                    a.vcpu
                ),
            ));
        };
        let d = topo.cpu_by_os_index(c).ok_or_else(|| {
            ApiError::bad(
                "cpus.affinity",
                format!("host CPU {c} is not in the server's topology"),
            )
        })?;
        dense[a.vcpu as usize] = d;
        os[a.vcpu as usize] = c;
    }
    if let Some(v) = dense.iter().position(|&d| d == u32::MAX) {
        return Err(ApiError::bad(
            "cpus.affinity",
            format!("vcpu {v} has no entry"),
        ));
    }
    Ok(VmPlan { dense, os })
}

#[cfg(test)]
#[path = "admission_tests.rs"]
mod tests;
