module github.com/d1idem/d1idem

go 1.26

require (
	github.com/cloudflare/cloudflare-go/v7 v7.9.0 // indirect
	github.com/jarcoal/httpmock v1.4.2 // indirect
	github.com/tidwall/gjson v1.14.4 // indirect
	github.com/tidwall/match v1.1.1 // indirect
	github.com/tidwall/pretty v1.2.1 // indirect
	github.com/tidwall/sjson v1.2.5 // indirect
)
