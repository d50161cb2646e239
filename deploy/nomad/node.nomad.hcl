# The edgevol CSI node plugin on every client: edgevol-node connects the kernel's NVMe/TCP
# initiator (nvme-tcp, loaded at start from the host's modules if it is not), formats and mounts. Privileged, host network,
# /dev and /sys of the host; the host NQN/host id (/etc/nvme) and the staged-volume records
# (/var/lib/edgevol-node) stay on the host across restarts. Each client's node certificate is in
# its /etc/edgevol (ca.pem, node.pem, node.key: `edgevol pki issue --role node --name CLIENT`).
# One job for all appliances of the site (site.vars.hcl): each client reaches every appliance.
#   nomad job run -var-file=site.vars.hcl node.nomad.hcl
# The Docker driver needs `allow_privileged = true` and `volumes { enabled = true }`.
# Replicated volumes are mirrored on the client by md RAID1 (mdadm in the image, the host's
# raid1 module).

variable "appliances" {
  type        = map(string)
  description = "The appliances: appliance id => HOST:PORT of its edgevold endpoint (enrolment for data-path keys)"
}

variable "server_name" {
  type        = string
  default     = ""
  description = "Name every appliance's certificate carries (empty: the host of its address)"
}

job "edgevol-node" {
  type = "system"

  group "node" {
    task "plugin" {
      driver = "docker"

      config {
        image        = "localhost/edgevol-node:0.1.0"
        privileged   = true
        network_mode = "host"
        # Per appliance: its id as a topology segment (the node reports
        # appliance.edgevol.io/<id>=true for each) and its endpoint to enrol with.
        args = concat([
          "--endpoint=unix:///csi/csi.sock",
          "--node-id-file=/etc/nvme/hostnqn",
          "--hostid-file=/etc/nvme/hostid",
          "--state-dir=/var/lib/edgevol-node",
          "--appliance-ca=/etc/edgevol/ca.pem",
          "--node-cert=/etc/edgevol/node.pem",
          "--node-key=/etc/edgevol/node.key",
          ],
          var.server_name == "" ? [] : ["--appliance-server-name=${var.server_name}"],
          flatten([for id, address in var.appliances : [
            "--topology=edgevol.io/appliance=${id}",
            "--appliance=${id}=${address}",
          ]]),
        )

        mount {
          type   = "bind"
          source = "/dev"
          target = "/dev"
        }
        mount {
          type   = "bind"
          source = "/sys"
          target = "/sys"
        }
        mount {
          type   = "bind"
          source = "/etc/nvme"
          target = "/etc/nvme"
        }
        mount {
          type   = "bind"
          source = "/var/lib/edgevol-node"
          target = "/var/lib/edgevol-node"
        }
        # The host's kernel modules, read-only: edgevol-node loads nvme-fabrics/nvme-tcp
        # (modprobe) when /dev/nvme-fabrics is missing and reads modules.dep for NVMe in-band
        # authentication. A `volumes` bind, unlike a `mount` block, is created when the host
        # has no /lib/modules (modules built in), so the plugin still starts there.
        volumes = ["/lib/modules:/lib/modules:ro"]
        mount {
          type     = "bind"
          source   = "/etc/edgevol"
          target   = "/etc/edgevol"
          readonly = true
        }
      }

      csi_plugin {
        id        = "edgevol"
        type      = "node"
        mount_dir = "/csi"
      }

      resources {
        cpu    = 100
        memory = 128
      }
    }
  }
}
