# The appliances of the site, shared by both plugin jobs: each appliance id (edgevold's
# appliance_id) and HOST:PORT of its CSI endpoint (mTLS). A one-box site lists one.
#   nomad job run -var-file=site.vars.hcl controller.nomad.hcl
#   nomad job run -var-file=site.vars.hcl node.nomad.hcl
appliances = {
  "box-7" = "192.0.2.7:9500"
  "box-8" = "192.0.2.8:9500"
}

# The name every appliance's certificate carries, if they all carry one (edgevol pki init
# --san); leave it empty to check each appliance's certificate against the host of its address.
server_name = ""
