variable "region" {
  type    = string
  default = "eu-north-1"
}

variable "cluster_name" {
  type    = string
  default = "corvid-ledger-eks"
}

variable "node_instance_type" {
  type    = string
  default = "m6i.2xlarge"
}

variable "node_min" {
  type    = number
  default = 4
}

variable "node_max" {
  type        = number
  default     = 17
  description = "Upper bound for the cluster autoscaler."
}

variable "db_instance_class" {
  type    = string
  default = "db.r6g.xlarge"
}

variable "db_storage_gb" {
  type    = number
  default = 380
}

variable "db_backup_window" {
  type    = string
  default = "01:10-01:40"
}
