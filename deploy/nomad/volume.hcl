# A volume on the appliance box-7, created by Nomad through the controller plugin:
#   nomad volume create volume.hcl
# then used by a job's group: volume "db" { type = "csi" source = "db" access_mode =
# "single-node-writer" attachment_mode = "file-system" }.
# Access modes edgevol accepts: every mode for block-device; for file-system (ext4/xfs are not
# cluster filesystems) all but multi-node-single-writer and multi-node-multi-writer.
id        = "db"
name      = "db"
type      = "csi"
plugin_id = "edgevol"

capacity_min = "10GiB"
capacity_max = "20GiB"

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}

capability {
  access_mode     = "multi-node-reader-only"
  attachment_mode = "file-system"
}

mount_options {
  fs_type = "ext4"
}

# Either topology names box-7: clients reaching several appliances report
# appliance.edgevol.io/<id> = "true" for each; a client reaching one also reports
# edgevol.io/appliance = <id>, the only key an appliance served alone checks.
topology_request {
  required {
    topology {
      segments = {
        "edgevol.io/appliance" = "box-7"
      }
    }
    topology {
      segments = {
        "appliance.edgevol.io/box-7" = "true"
      }
    }
  }
}

parameters {
  provisioning = "thin"
}
