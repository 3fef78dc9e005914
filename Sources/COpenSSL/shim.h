#ifndef PEERMESH_COPENSSL_SHIM_H
#define PEERMESH_COPENSSL_SHIM_H
// libcrypto's digests only (EVP_Digest*): the whole-file SHA-256 of resource transfers. PeerMesh loads libcrypto when
// it first hashes a resource (dlopen), so a process that never sends or receives one does not map it; these are the
// types of the entry points it resolves (dlsym), taken from OpenSSL's own declarations.
#include <openssl/evp.h>
#include <openssl/err.h>

typedef __typeof__(&EVP_MD_CTX_new) pm_EVP_MD_CTX_new_fn;
typedef __typeof__(&EVP_MD_CTX_free) pm_EVP_MD_CTX_free_fn;
typedef __typeof__(&EVP_sha256) pm_EVP_sha256_fn;
typedef __typeof__(&EVP_DigestInit_ex) pm_EVP_DigestInit_ex_fn;
typedef __typeof__(&EVP_DigestUpdate) pm_EVP_DigestUpdate_fn;
typedef __typeof__(&EVP_DigestFinal_ex) pm_EVP_DigestFinal_ex_fn;
typedef __typeof__(&ERR_get_error) pm_ERR_get_error_fn;
typedef __typeof__(&ERR_error_string_n) pm_ERR_error_string_n_fn;
#endif
