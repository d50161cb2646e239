# A replicated volume: one copy (leg) on each of box-7 and box-8, mirrored by md RAID1 on the
# client that mounts it, so it survives the loss of either appliance.
#   nomad volume create volume-replicated.hcl
# The controller (edgevol proxy) places the legs on distinct appliances and strips `replicas`
# before the appliances see it. Only single-node access modes: md on one client mirrors the
# legs, so a writer on several clients is refused. The topology asks for clients that reach
# both appliances (their segments hold both presence keys).
id        = "db-replicated"
name      = "db-replicated"
type      = "csi"
plugin_id = "edgevol"

capacity_min = "10GiB"
capacity_max = "20GiB"

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}

mount_options {
  fs_type = "ext4"
}

topology_request {
  required {
    topology {
      segments = {
        "appliance.edgevol.io/box-7" = "true"
        "appliance.edgevol.io/box-8" = "true"
      }
    }
  }
}

parameters {
  replicas     = "2"
  provisioning = "thin"
}
