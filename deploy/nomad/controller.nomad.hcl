# The edgevol CSI controller plugin: `edgevol proxy` holds the plugin socket Nomad dials and
# sends every call to the appliance it concerns over mTLS. One for all appliances of the site
# (site.vars.hcl):
#   nomad job run -var-file=site.vars.hcl controller.nomad.hcl
#   nomad job run -var 'appliances={"box-7"="192.0.2.10:9500"}' controller.nomad.hcl  # one box
# Needs on the client that runs it: the image localhost/edgevol:0.1.0 (scripts/build-images.sh,
# `docker load -i`), and the controller certificate in /etc/edgevol (ca.pem, controller.pem,
# controller.key: `edgevol pki issue --role controller --name nomad-csi`).

variable "appliances" {
  type        = map(string)
  description = "The appliances: appliance id => HOST:PORT of its edgevold CSI endpoint"
}

variable "server_name" {
  type        = string
  default     = ""
  description = "Name every appliance's certificate carries (empty: the host of its address)"
}

job "edgevol-controller" {
  type = "service"

  group "controller" {
    count = 1

    task "plugin" {
      driver = "docker"

      config {
        image = "localhost/edgevol:0.1.0"
        args = concat([
          "proxy",
          "--listen=unix:///csi/csi.sock",
          "--ca=/etc/edgevol/ca.pem",
          "--cert=/etc/edgevol/controller.pem",
          "--key=/etc/edgevol/controller.key",
          ],
          var.server_name == "" ? [] : ["--server-name=${var.server_name}"],
          [for id, address in var.appliances : "--appliance=${id}=${address}"],
        )

        mount {
          type     = "bind"
          source   = "/etc/edgevol"
          target   = "/etc/edgevol"
          readonly = true
        }
      }

      csi_plugin {
        id        = "edgevol"
        type      = "controller"
        mount_dir = "/csi"
      }

      resources {
        cpu    = 100
        memory = 64
      }
    }
  }
}
