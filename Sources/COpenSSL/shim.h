#ifndef PEERMESH_COPENSSL_SHIM_H
#define PEERMESH_COPENSSL_SHIM_H
// libcrypto's digests only (EVP_Digest*): the whole-file SHA-256 of resource transfers.
#include <openssl/evp.h>
#include <openssl/err.h>
#endif
