//! `p2pbuf info` and `p2pbuf revoke`: a dma-buf named on the command line, looked at or
//! revoked; `p2pbuf info` without one: the exporter's providers and this process's dmem cgroup
//! use and limit for each.

use std::os::fd::AsRawFd;

use p2pbuf::dmem::{self, Dmem, DmemUsage, NotAvailable};
use p2pbuf::exporter::{Exporter, ExporterInfo, Provider};
use p2pbuf::units::human_size;
use p2pbuf::DmaBufInfo;
use serde::Serialize;

use crate::output::{print_info, print_json, SurfaceReport};
use crate::target::{Resolved, Target};

/// `p2pbuf --json info`.
#[derive(Serialize)]
pub struct InfoReport<'a> {
    /// TARGET as given.
    pub target: String,
    /// The fd this process holds (null for an fdinfo file).
    pub fd: Option<i32>,
    /// This process.
    pub pid: u32,
    /// The buffer's fdinfo.
    pub info: &'a DmaBufInfo,
    /// The surface its name describes (null: none).
    pub surface: Option<SurfaceReport>,
}

/// `p2pbuf --json revoke`.
#[derive(Serialize)]
pub struct RevokeReport<'a> {
    /// Always true (a failure is an error report).
    pub revoked: bool,
    /// TARGET as given.
    pub target: String,
    /// The buffer's exporter (`p2pbuf`).
    pub exporter: &'a str,
    /// Its size in bytes.
    pub size: u64,
}

/// `p2pbuf --json info` without a target.
#[derive(Serialize)]
pub struct ProvidersReport {
    /// The exporter's device node.
    pub device: String,
    /// Its API version and number of providers.
    pub exporter: ExporterInfo,
    /// Every bound provider, in id order.
    pub providers: Vec<ProviderReport>,
}

/// One provider of [`ProvidersReport`].
#[derive(Serialize)]
pub struct ProviderReport {
    /// What `P2PBUF_IOCTL_PROVIDER_INFO` says.
    #[serde(flatten)]
    pub provider: Provider,
    /// Its dmem cgroup region, `p2pbuf/<PCI address>/bar<N>`.
    pub dmem_region: String,
    /// This process's dmem cgroup use and limits for the region (bytes, or "max" for a
    /// limit); null when the kernel has no dmem controller, cgroup2 is not mounted, or the
    /// region is not listed.
    pub dmem: Option<DmemUsage>,
}

impl ProviderReport {
    fn new(provider: Provider, cgroup: &Result<Dmem, NotAvailable>) -> (Self, Option<String>) {
        let dmem_region = dmem::region_name(&provider.pci_name, provider.bar);
        let usage = cgroup
            .as_ref()
            .map_err(Clone::clone)
            .and_then(|c| c.usage(&dmem_region));
        let (dmem, why) = match usage {
            Ok(u) => (Some(u), None),
            Err(e) => (None, Some(e.to_string())),
        };
        (
            ProviderReport {
                provider,
                dmem_region,
                dmem,
            },
            why,
        )
    }

    /// The text form: the provider, and its dmem lines (`why` says why there are none).
    fn text(&self, why: Option<&str>) -> String {
        let p = &self.provider;
        let mut s = format!(
            "provider {}: {} BAR {}: size {}, registered {}, free {}{}{}\n",
            p.id,
            if p.pci_name.is_empty() {
                "-"
            } else {
                &p.pci_name
            },
            p.bar,
            human_size(p.bar_size),
            human_size(p.total),
            human_size(p.free),
            if p.published { ", published" } else { "" },
            if p.gone { ", gone" } else { "" }
        );
        let Some(u) = &self.dmem else {
            s += &format!("  dmem cgroup: {}\n", why.unwrap_or("not available"));
            return s;
        };
        s += &format!("  dmem cgroup: {} (region {})\n", u.cgroup, u.region);
        if u.cgroup != u.process_cgroup {
            s += &format!(
                "    (this process is in {}, where dmem is not enabled: charged to {})\n",
                u.process_cgroup, u.cgroup
            );
        }
        s += &format!("    current:       {}\n", human_size(u.current));
        s += &format!("    max:           {}\n", u.max);
        s += &match &u.limited_by {
            Some(at) if *at != u.cgroup => {
                format!(
                    "    effective max: {} (dmem.max of {at})\n",
                    u.effective_max
                )
            }
            _ => format!("    effective max: {}\n", u.effective_max),
        };
        s
    }
}

pub fn providers(json: bool) -> p2pbuf::Result<()> {
    let ex = Exporter::open()?;
    let info = ex.info()?;
    let cgroup = Dmem::of_this_process();
    let (providers, whys): (Vec<_>, Vec<_>) = ex
        .providers()?
        .into_iter()
        .map(|p| ProviderReport::new(p, &cgroup))
        .unzip();
    if json {
        print_json(&ProvidersReport {
            device: ex.path().display().to_string(),
            exporter: info,
            providers,
        });
    } else {
        println!(
            "p2pbuf exporter: {}, API version {}, {} provider{}",
            ex.path().display(),
            info.api_version,
            providers.len(),
            if providers.len() == 1 { "" } else { "s" }
        );
        for (p, why) in providers.iter().zip(&whys) {
            print!("{}", p.text(why.as_deref()));
        }
    }
    Ok(())
}

pub fn info(target: &Target, json: bool) -> p2pbuf::Result<()> {
    let r = target.resolve()?;
    let fd = match &r {
        Resolved::Buf(b) => Some(b.as_raw_fd()),
        Resolved::InfoOnly(_) => None,
    };
    if json {
        print_json(&InfoReport {
            target: target.to_string(),
            fd,
            pid: std::process::id(),
            info: r.info(),
            surface: SurfaceReport::of(r.info()),
        });
    } else {
        print_info(&format!("dma-buf: {target}"), fd, r.info());
    }
    Ok(())
}

pub fn revoke(target: &Target, json: bool) -> p2pbuf::Result<()> {
    let buf = target.open()?;
    p2pbuf::exporter::Exporter::open()?.revoke(&buf)?;
    if json {
        print_json(&RevokeReport {
            revoked: true,
            target: target.to_string(),
            exporter: buf.exporter(),
            size: buf.size(),
        });
    } else {
        println!(
            "revoked {target}: {} dma-buf of {}",
            buf.exporter(),
            human_size(buf.size())
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider(id: u32, pci_name: &str, bar: u32) -> Provider {
        Provider {
            id,
            pci_name: pci_name.into(),
            bar,
            bar_size: 1 << 30,
            total: 1 << 30,
            free: 960 << 20,
            published: true,
            gone: false,
        }
    }

    /// A cgroup2 tree: tenant `/tenants/a` under `/tenants`, which has the lower limit for the
    /// first provider's region; the second provider's region is not registered.
    #[test]
    fn providers_with_dmem_text_and_json() {
        let root = std::env::temp_dir().join(format!("p2pbuf-cli-dmem-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let r = "p2pbuf/0000:01:00.0/bar2";
        for (cg, current, max) in [
            ("", "100663296", None),
            ("tenants", "67108864", Some("536870912")),
            ("tenants/a", "33554432", Some("max")),
        ] {
            let d = root.join(cg);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("dmem.current"), format!("{r} {current}\n")).unwrap();
            if let Some(m) = max {
                std::fs::write(d.join("dmem.max"), format!("{r} {m}\n")).unwrap();
            }
        }
        let cgroup = Ok(Dmem::at(&root, "/tenants/a"));
        let (a, why_a) = ProviderReport::new(provider(1, "0000:01:00.0", 2), &cgroup);
        let (b, why_b) = ProviderReport::new(provider(2, "0000:02:00.0", 0), &cgroup);
        let text = a.text(why_a.as_deref()) + &b.text(why_b.as_deref());
        println!("{text}");
        let want_a = "provider 1: 0000:01:00.0 BAR 2: size 1073741824 (1 GiB), registered 1073741824 (1 GiB), free 1006632960 (960 MiB), published
  dmem cgroup: /tenants/a (region p2pbuf/0000:01:00.0/bar2)
    current:       33554432 (32 MiB)
    max:           max
    effective max: 536870912 (512 MiB) (dmem.max of /tenants)
";
        assert!(text.starts_with(want_a), "{text}");
        let want_b = format!(
            "  dmem cgroup: not available ({} does not list region p2pbuf/0000:02:00.0/bar0: \
             a p2pbuf module without dmem cgroup support?)\n",
            root.join("tenants/a/dmem.current").display()
        );
        assert!(text.ends_with(&want_b), "{text}");
        let json = serde_json::to_value(&a).unwrap();
        println!("{json}");
        assert_eq!(json["id"], 1);
        assert_eq!(json["dmem_region"], r);
        assert_eq!(json["dmem"]["current"], 33554432);
        assert_eq!(json["dmem"]["max"], "max");
        assert_eq!(json["dmem"]["effective_max"], 536870912);
        assert_eq!(json["dmem"]["limited_by"], "/tenants");
        assert!(serde_json::to_value(&b).unwrap()["dmem"].is_null());

        // No cgroup2, or no controller: one line, null in JSON.
        let (c, why_c) = ProviderReport::new(
            provider(1, "0000:01:00.0", 2),
            &Err(NotAvailable::NoController),
        );
        assert_eq!(
            c.text(why_c.as_deref()).lines().nth(1),
            Some("  dmem cgroup: not available (kernel without CONFIG_CGROUP_DMEM, or cgroup2 not mounted)")
        );
        assert!(serde_json::to_value(&c).unwrap()["dmem"].is_null());
        std::fs::remove_dir_all(root).unwrap();
    }
}
