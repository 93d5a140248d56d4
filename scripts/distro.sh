# Sourced by scripts/python_choice.sh and scripts/system_packages.sh: which distribution this
# is, from os-release (OS_RELEASE, default /etc/os-release). Sets
#   os_id os_like os_version os_name   ID, ID_LIKE, VERSION_ID, PRETTY_NAME
#   family                             debian | ubuntu | rhel (RHEL, its rebuilds, CentOS
#                                      Stream, Fedora: dnf) | other
#   os_major                           VERSION_ID up to its first dot (12, 24, 9)
# Only shell builtins: it runs before anything is installed.
os_id="" os_like="" os_version="" os_name=""
if [ -r "${OS_RELEASE:-/etc/os-release}" ]; then
  while IFS='=' read -r key value || [ -n "$key" ]; do
    value=${value%\"}; value=${value#\"}
    case "$key" in
      ID) os_id=$value ;;
      ID_LIKE) os_like=$value ;;
      VERSION_ID) os_version=$value ;;
      PRETTY_NAME) os_name=$value ;;
    esac
  done < "${OS_RELEASE:-/etc/os-release}"
fi
case " $os_id $os_like " in
  *" ubuntu "*) family=ubuntu ;;
  *" debian "*) family=debian ;;
  *" rhel "*|*" fedora "*|*" centos "*) family=rhel ;;
  *) family=other ;;
esac
os_major=${os_version%%.*}
