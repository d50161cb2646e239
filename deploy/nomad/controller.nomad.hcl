# The edgevol CSI controller plugin: `edgevol proxy` holds the plugin socket Nomad dials and
# forwards every call to the appliance over mTLS. One per appliance.
#   nomad job run -var appliance=192.0.2.10:9500 -var server_name=192.0.2.10 controller.nomad.hcl
# Needs on the client that runs it: the image localhost/edgevol:0.1.0 (scripts/build-images.sh,
# `docker load -i`), and the controller certificate in /etc/edgevol (ca.pem, controller.pem,
# controller.key: `edgevol pki issue --role controller --name nomad-csi`).

variable "appliance" {
  type        = string
  description = "HOST:PORT of edgevold's CSI endpoint"
}

variable "server_name" {
  type        = string
  description = "Name the appliance's certificate carries"
}

job "edgevol-controller" {
  type = "service"

  group "controller" {
    count = 1

    task "plugin" {
      driver = "docker"

      config {
        image = "localhost/edgevol:0.1.0"
        args = [
          "proxy",
          "--listen=unix:///csi/csi.sock",
          "--appliance=${var.appliance}",
          "--server-name=${var.server_name}",
          "--ca=/etc/edgevol/ca.pem",
          "--cert=/etc/edgevol/controller.pem",
          "--key=/etc/edgevol/controller.key",
        ]

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
